package tidelog.spark;

import java.util.List;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * One Spark task: its ranges in order, one columnar batch per frame the server sends (its size
 * see {@link RangeRead}), over the JVM's shared channel to each server ({@link
 * Connection#shared}); its subscription ends with the task (also when Spark stops it early).
 */
final class FrameReader implements PartitionReader<ColumnarBatch> {
  private final Settings settings;
  private final List<long[]> ranges;
  private final StructType schema;
  private final boolean omitValues;
  private final boolean omitTimestamps;
  private int index;
  private RangeRead range;
  private ColumnarBatch batch;

  FrameReader(Settings settings, List<long[]> ranges, StructType schema) {
    this.settings = settings;
    this.ranges = ranges;
    this.schema = schema;
    List<String> names = List.of(schema.fieldNames());
    this.omitValues = !names.contains("value");
    this.omitTimestamps = !names.contains("timestamp");
  }

  @Override
  public boolean next() {
    while (true) {
      if (range == null) {
        if (index == ranges.size()) {
          return false;
        }
        range = new RangeRead(
                settings, ranges.get(index++), omitValues, omitTimestamps, this::connection);
      }
      Frame frame = range.next();
      if (frame == null) {
        range.close();
        range = null;
        continue;
      }
      batch = Columns.batch(frame, schema, settings.stream, range.partition);
      return true;
    }
  }

  private Connection connection(String address) {
    return Connection.shared(address, settings);
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() {
    if (range != null) {
      range.close(); // ends the subscription; the channel stays for other tasks
    }
  }
}
