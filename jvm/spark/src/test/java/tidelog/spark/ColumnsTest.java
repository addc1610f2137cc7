package tidelog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.sql.vectorized.ColumnarRow;
import org.junit.jupiter.api.Test;

/** {@link Columns}: Spark's column vectors over a parsed frame, read as Spark reads them. */
class ColumnsTest {
  private static ColumnarBatch batch(byte[] frame, String... columns) {
    StructType schema = new StructType();
    for (String column : columns) {
      schema = schema.add(Columns.SCHEMA.apply(column));
    }
    return Columns.batch(Frame.parse(frame), schema, "orders", 3);
  }

  private static byte[] bytes(String text) {
    return Proto.utf8(text);
  }

  @Test
  void offsetsAndTimestampsFlooredFromNanosToMicros() {
    long[] nanos = {0, 1999, 2000, -1, -1000, -1001, Long.MIN_VALUE, Long.MAX_VALUE};
    Proto messages = new Proto().bytes(2, Proto.ints(new int[nanos.length]));
    byte[] frame =
        new Proto()
            .bytes(1, Proto.longs(10, 11, 12, 13, 14, 15, 16, 1L << 62))
            .bytes(2, Proto.longs(nanos))
            .message(3, messages)
            .toByteArray();
    ColumnarBatch batch = batch(frame, "offset", "timestamp");
    assertEquals(8, batch.numRows());
    ColumnVector offsets = batch.column(0);
    ColumnVector timestamps = batch.column(1);
    long[] micros = {
      0, 1, 2, -1, -1, -2, Math.floorDiv(Long.MIN_VALUE, 1000), Long.MAX_VALUE / 1000
    };
    for (int i = 0; i < nanos.length; i++) {
      assertEquals(micros[i], timestamps.getLong(i), "row " + i);
      assertFalse(timestamps.isNullAt(i));
    }
    assertEquals(10, offsets.getLong(0));
    assertEquals(1L << 62, offsets.getLong(7));
    assertFalse(offsets.hasNull());
  }

  @Test
  void keysValuesStreamAndPartition() {
    Proto messages =
        new Proto()
            .string(1, "..abc.d")
            .bytes(2, Proto.ints(3, 0, 1))
            .bytes(6, Proto.ints(2, 0, 6))
            .string(3, "kk")
            .bytes(4, Proto.ints(-1, 0, 2));
    ColumnarBatch batch =
        batch(Proto.frame(messages, 0, 1, 2), "value", "key", "stream", "partition");
    ColumnVector values = batch.column(0);
    ColumnVector keys = batch.column(1);
    assertArrayEquals(bytes("abc"), values.getBinary(0));
    assertArrayEquals(new byte[0], values.getBinary(1));
    assertArrayEquals(bytes("d"), values.getBinary(2));
    assertFalse(values.hasNull());

    assertTrue(keys.isNullAt(0));
    assertNull(keys.getBinary(0));
    assertFalse(keys.isNullAt(1));
    assertArrayEquals(new byte[0], keys.getBinary(1));
    assertArrayEquals(bytes("kk"), keys.getBinary(2));
    assertEquals(1, keys.numNulls());

    for (int i = 0; i < 3; i++) {
      assertEquals("orders", batch.column(2).getUTF8String(i).toString());
      assertEquals(3, batch.column(3).getInt(i));
    }
  }

  @Test
  void keysOfAFrameWithoutKeySizesAreAllNull() {
    ColumnVector keys = batch(Proto.frame(Proto.values("a", "b"), 0, 1), "key").column(0);
    assertEquals(2, keys.numNulls());
    assertTrue(keys.isNullAt(0));
    assertNull(keys.getBinary(1));
  }

  @Test
  void headersNoneIsNullInEveryRow() {
    ColumnVector headers = batch(Proto.frame(Proto.values("a", "b"), 0, 1), "headers").column(0);
    assertEquals(2, headers.numNulls());
    assertTrue(headers.isNullAt(0));
    assertTrue(headers.isNullAt(1));
  }

  @Test
  void headersAsListsOfNameAndValue() {
    Proto messages =
        Proto.values("a", "b", "c")
            .message(5, Proto.headerList(Proto.header("trace", "t1"), Proto.header("", "")))
            .message(5, Proto.headerList())
            .message(5, Proto.headerList(Proto.header("née", "v\u0000")));
    ColumnVector headers = batch(Proto.frame(messages, 0, 1, 2), "headers").column(0);
    assertEquals(1, headers.numNulls());
    assertFalse(headers.isNullAt(0));
    assertTrue(headers.isNullAt(1));

    ColumnarArray first = headers.getArray(0);
    assertEquals(2, first.numElements());
    ColumnarRow trace = first.getStruct(0, 2);
    assertEquals("trace", trace.getUTF8String(0).toString());
    assertArrayEquals(bytes("t1"), trace.getBinary(1));
    ColumnarRow empty = first.getStruct(1, 2);
    assertEquals("", empty.getUTF8String(0).toString());
    assertArrayEquals(new byte[0], empty.getBinary(1));

    ColumnarArray last = headers.getArray(2);
    assertEquals(1, last.numElements());
    assertEquals("née", last.getStruct(0, 2).getUTF8String(0).toString());
    assertArrayEquals(bytes("v\u0000"), last.getStruct(0, 2).getBinary(1));
  }

  @Test
  void aValueColumnOfAFrameReadWithoutValuesIsRefused() {
    byte[] frame = Proto.frame(new Proto().bytes(2, Proto.ints(4)).varint(7, 1), 0);
    assertThrows(Wire.MalformedFrame.class, () -> batch(frame, "value"));
    assertEquals(1, batch(frame, "offset", "key").numRows());
  }

  @Test
  void checkRefusesColumnsTheSourceDoesNotHave() {
    Columns.check(Columns.SCHEMA);
    IllegalArgumentException unknown =
        assertThrows(
            IllegalArgumentException.class,
            () -> Columns.check(new StructType().add("nope", "string")));
    assertTrue(unknown.getMessage().contains("no column 'nope'"), unknown.getMessage());
    IllegalArgumentException retyped =
        assertThrows(
            IllegalArgumentException.class,
            () -> Columns.check(new StructType().add("offset", "int")));
    assertTrue(retyped.getMessage().contains("column 'offset' is BIGINT"), retyped.getMessage());
  }
}
