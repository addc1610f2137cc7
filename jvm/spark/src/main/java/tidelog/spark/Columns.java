package tidelog.spark;

import java.util.Arrays;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The source's columns and the Spark column vectors that read a {@link Frame} in place: offsets
 * and timestamps straight from the frame's little-endian arrays, keys, values and headers as
 * positions in its buffer (copied only when Spark asks for a row's bytes), the stream and the
 * partition as constants. A frame's batch holds only the columns the query reads.
 */
final class Columns {
  private Columns() {}

  static final StructType HEADER =
      new StructType(
          new StructField[] {
            DataTypes.createStructField("key", DataTypes.StringType, true),
            DataTypes.createStructField("value", DataTypes.BinaryType, true),
          });
  static final ArrayType HEADERS = DataTypes.createArrayType(HEADER, true);

  /** The source's schema, as the Python source's (tidelog/spark/columns.py). */
  static final StructType SCHEMA =
      new StructType(
          new StructField[] {
            DataTypes.createStructField("key", DataTypes.BinaryType, true),
            DataTypes.createStructField("value", DataTypes.BinaryType, true),
            DataTypes.createStructField("stream", DataTypes.StringType, true),
            DataTypes.createStructField("partition", DataTypes.IntegerType, true),
            DataTypes.createStructField("offset", DataTypes.LongType, true),
            DataTypes.createStructField("timestamp", DataTypes.TimestampType, true),
            DataTypes.createStructField("headers", HEADERS, true),
          });

  /** {@code schema}'s columns, each one of the source's with its type; else why not. */
  static void check(StructType schema) {
    for (StructField field : schema.fields()) {
      String name = field.name();
      if (!Arrays.asList(SCHEMA.fieldNames()).contains(name)) {
        throw new IllegalArgumentException(
            "no column '" + name + "' in a tidelog stream: the columns are "
                + String.join(", ", SCHEMA.fieldNames()));
      }
      DataType type = SCHEMA.apply(name).dataType();
      if (!field.dataType().sameType(type)) {
        throw new IllegalArgumentException(
            "column '" + name + "' is " + type.sql() + ", not " + field.dataType().sql());
      }
    }
  }

  /** One Spark batch of {@code frame}'s records with the columns of {@code schema}. */
  static ColumnarBatch batch(Frame frame, StructType schema, String stream, int partition) {
    StructField[] fields = schema.fields();
    ColumnVector[] vectors = new ColumnVector[fields.length];
    for (int c = 0; c < fields.length; c++) {
      vectors[c] =
          switch (fields[c].name()) {
            case "key" -> new Bytes(DataTypes.BinaryType, frame.buf, frame.keyBounds(), frame.count);
            case "value" -> new Bytes(DataTypes.BinaryType, frame.buf, frame.valueBounds(), frame.count);
            case "stream" -> new Constant(DataTypes.StringType, 0, UTF8String.fromString(stream), 0);
            case "partition" -> new Constant(DataTypes.IntegerType, partition, null, 0);
            case "offset" -> new Longs(DataTypes.LongType, frame.buf, frame.offsetsAt, 1);
            case "timestamp" -> timestamps(frame);
            case "headers" -> headers(frame);
            default -> throw new IllegalArgumentException("no column '" + fields[c].name() + "'");
          };
    }
    return new ColumnarBatch(vectors, frame.count);
  }

  private static ColumnVector timestamps(Frame frame) {
    if (frame.timestampsOmitted()) {
      throw new Wire.MalformedFrame("a frame without timestamps for a query that reads them");
    }
    return new Longs(DataTypes.TimestampType, frame.buf, frame.timestampsAt, 1000);
  }

  private static ColumnVector headers(Frame frame) {
    Frame.Headers headers = frame.headers();
    if (headers == null) {
      return new Constant(HEADERS, 0, null, frame.count);
    }
    return new HeaderLists(frame.buf, headers);
  }

  /** What every vector here does not support: the types the source has none of. */
  private abstract static class View extends ColumnVector {
    View(DataType type) {
      super(type);
    }

    @Override
    public void close() {}

    @Override
    public boolean hasNull() {
      return numNulls() > 0;
    }

    @Override
    public int numNulls() {
      return 0;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return false;
    }

    private UnsupportedOperationException unsupported() {
      return new UnsupportedOperationException(type.sql() + " column of a tidelog stream");
    }

    @Override
    public boolean getBoolean(int rowId) {
      throw unsupported();
    }

    @Override
    public byte getByte(int rowId) {
      throw unsupported();
    }

    @Override
    public short getShort(int rowId) {
      throw unsupported();
    }

    @Override
    public int getInt(int rowId) {
      throw unsupported();
    }

    @Override
    public long getLong(int rowId) {
      throw unsupported();
    }

    @Override
    public float getFloat(int rowId) {
      throw unsupported();
    }

    @Override
    public double getDouble(int rowId) {
      throw unsupported();
    }

    @Override
    public ColumnarArray getArray(int rowId) {
      throw unsupported();
    }

    @Override
    public ColumnarMap getMap(int ordinal) {
      throw unsupported();
    }

    @Override
    public Decimal getDecimal(int rowId, int precision, int scale) {
      throw unsupported();
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
      throw unsupported();
    }

    @Override
    public byte[] getBinary(int rowId) {
      throw unsupported();
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      throw unsupported();
    }
  }

  /** Little-endian int64s in place, each floored by {@code divisor} (ns to Spark's µs). */
  static final class Longs extends View {
    private final byte[] buf;
    private final int at;
    private final long divisor;

    Longs(DataType type, byte[] buf, int at, long divisor) {
      super(type);
      this.buf = buf;
      this.at = at;
      this.divisor = divisor;
    }

    @Override
    public long getLong(int rowId) {
      long value = (long) Frame.LONGS.get(buf, at + 8 * rowId);
      return divisor == 1 ? value : Math.floorDiv(value, divisor);
    }
  }

  /** The same value in every row: the stream's name, the partition, or null (headers of a
   * frame whose records have none). */
  static final class Constant extends View {
    private final int number;
    private final UTF8String text;
    private final int nulls;

    /** {@code nulls}: 0, or the batch's row count for a column null in every row. */
    Constant(DataType type, int number, UTF8String text, int nulls) {
      super(type);
      this.number = number;
      this.text = text;
      this.nulls = nulls;
    }

    @Override
    public int numNulls() {
      return nulls;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return nulls > 0;
    }

    @Override
    public int getInt(int rowId) {
      return number;
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
      return text;
    }
  }

  /** Byte strings in a buffer: row i at {@code bounds[i]}, {@code bounds[n + i]} bytes, null
   * when that size is -1 (or every row, without bounds). As text for a string type. */
  static final class Bytes extends View {
    private final byte[] buf;
    private final int[] bounds;
    private final int count;
    private final int nulls;

    Bytes(DataType type, byte[] buf, int[] bounds, int count) {
      super(type);
      this.buf = buf;
      this.bounds = bounds;
      this.count = count;
      int none = 0;
      if (bounds == null) {
        none = count;
      } else {
        for (int i = 0; i < count; i++) {
          if (bounds[count + i] < 0) {
            none++;
          }
        }
      }
      this.nulls = none;
    }

    @Override
    public int numNulls() {
      return nulls;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return bounds == null || bounds[count + rowId] < 0;
    }

    @Override
    public byte[] getBinary(int rowId) {
      if (isNullAt(rowId)) {
        return null;
      }
      int start = bounds[rowId];
      return Arrays.copyOfRange(buf, start, start + bounds[count + rowId]);
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
      if (isNullAt(rowId)) {
        return null;
      }
      return UTF8String.fromBytes(buf, bounds[rowId], bounds[count + rowId]);
    }
  }

  /** Each record's header list (null for a record without headers, as Spark's Kafka source). */
  static final class HeaderLists extends View {
    private final Frame.Headers headers;
    private final Entries entries;
    private final int nulls;

    HeaderLists(byte[] buf, Frame.Headers headers) {
      super(HEADERS);
      this.headers = headers;
      this.entries = new Entries(buf, headers);
      int none = 0;
      for (int i = 0; i + 1 < headers.first.length; i++) {
        if (headers.first[i] == headers.first[i + 1]) {
          none++;
        }
      }
      this.nulls = none;
    }

    @Override
    public int numNulls() {
      return nulls;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return headers.first[rowId] == headers.first[rowId + 1];
    }

    @Override
    public ColumnarArray getArray(int rowId) {
      int first = headers.first[rowId];
      return new ColumnarArray(entries, first, headers.first[rowId + 1] - first);
    }
  }

  /** A frame's header entries as structs of (key string, value binary). */
  static final class Entries extends View {
    private final ColumnVector[] children;

    Entries(byte[] buf, Frame.Headers headers) {
      super(HEADER);
      int n = headers.nameStarts.length;
      this.children =
          new ColumnVector[] {
            new Bytes(DataTypes.StringType, buf, join(headers.nameStarts, headers.nameLengths), n),
            new Bytes(DataTypes.BinaryType, buf, join(headers.valueStarts, headers.valueLengths), n),
          };
    }

    private static int[] join(int[] starts, int[] lengths) {
      int[] bounds = Arrays.copyOf(starts, starts.length + lengths.length);
      System.arraycopy(lengths, 0, bounds, starts.length, lengths.length);
      return bounds;
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      return children[ordinal];
    }
  }
}
