package tidelog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.Test;

/** {@link Wire}'s requests, read back field by field with {@link Wire.Reader}, and the reader. */
class WireTest {
  /** One field as read: number, wire type, and its value (a LEN field's bytes as text). */
  private record Field(int number, int type, Object value) {}

  private static List<Field> read(byte[] buf) {
    List<Field> fields = new ArrayList<>();
    Wire.Reader reader = new Wire.Reader(buf, 0, buf.length);
    while (reader.next()) {
      Object value =
          reader.type == Wire.LEN
              ? new String(buf, reader.start, reader.length, StandardCharsets.UTF_8)
              : (Object) reader.value;
      fields.add(new Field(reader.field, reader.type, value));
    }
    return fields;
  }

  private static Field varint(int number, long value) {
    return new Field(number, Wire.VARINT, value);
  }

  @Test
  void subscribeRangeHasEveryFieldInOrder() {
    byte[] request = Wire.subscribeRange("orders", 7, 100, 250, false, 10_000, true);
    assertEquals(
        List.of(
            new Field(1, Wire.LEN, "orders"),
            varint(2, 7),
            varint(3, Wire.START_OFFSET),
            varint(4, 100),
            varint(6, Wire.STOP_OFFSET),
            varint(7, 250),
            varint(11, 10_000),
            varint(13, 1),
            varint(14, 1)),
        read(request));
  }

  @Test
  void subscribeRangeWithoutTimestamps() {
    byte[] request = Wire.subscribeRange("s", 0, 0, 9, false, 5, false, true);
    assertEquals(
        List.of(
            new Field(1, Wire.LEN, "s"),
            varint(3, Wire.START_OFFSET),
            varint(6, Wire.STOP_OFFSET),
            varint(7, 9),
            varint(11, 5),
            varint(15, 1)),
        read(request));
  }

  @Test
  void subscribeRangeNewestFirstWithLargeNumbers() {
    byte[] request =
        Wire.subscribeRange("ström", Integer.MAX_VALUE, Long.MAX_VALUE, 1L << 40, true, 1, false);
    assertEquals(
        List.of(
            new Field(1, Wire.LEN, "ström"),
            varint(2, Integer.MAX_VALUE),
            varint(3, Wire.START_OFFSET),
            varint(4, Long.MAX_VALUE),
            varint(6, Wire.STOP_OFFSET),
            varint(7, 1L << 40),
            varint(9, 1),
            varint(11, 1)),
        read(request));
  }

  @Test
  void subscribeRangeLeavesZeroValuesOutAsProtobufDoes() {
    byte[] request = Wire.subscribeRange("s", 0, 0, 0, false, 5, false);
    assertEquals(
        List.of(
            new Field(1, Wire.LEN, "s"),
            varint(3, Wire.START_OFFSET),
            varint(6, Wire.STOP_OFFSET),
            varint(11, 5)),
        read(request));
  }

  @Test
  void subscribeRangeBytesAreProtobufs() {
    // Field 1 "s", then partition 1 (tag 0x10), start_position 1 (0x18), start_offset 300 as
    // two varint bytes (0x20 0xAC 0x02), stop_position 1 (0x30), stop_offset 301 (0x38 0xAD 0x02),
    // reverse (0x48 1), max_messages 2 (0x58 2).
    byte[] expected = {
      0x0A, 1, 's', 0x10, 1, 0x18, 1, 0x20, (byte) 0xAC, 0x02, 0x30, 1, 0x38, (byte) 0xAD, 0x02,
      0x48, 1, 0x58, 2
    };
    assertArrayEquals(expected, Wire.subscribeRange("s", 1, 300, 301, true, 2, false));
  }

  @Test
  void subscribeOldest() {
    assertEquals(
        List.of(
            new Field(1, Wire.LEN, "s"),
            varint(2, 3),
            varint(3, Wire.START_EARLIEST),
            varint(9, 1),
            varint(11, 1)),
        read(Wire.subscribeOldest("s", 3)));
  }

  @Test
  void aNegativeVarintIsTenBytesAndReadsBack() {
    Wire.Writer writer = new Wire.Writer();
    writer.varint(2, -1);
    byte[] buf = writer.toByteArray();
    assertEquals(11, buf.length);
    assertEquals(List.of(varint(2, -1)), read(buf));
  }

  @Test
  void theReaderStaysInsideItsRange() {
    byte[] buf = new Proto().varint(1, 5).varint(2, 6).varint(3, 7).toByteArray();
    Wire.Reader reader = new Wire.Reader(buf, 2, 4);
    assertEquals(true, reader.next());
    assertEquals(2, reader.field);
    assertEquals(6, reader.value);
    assertFalse(reader.next());
    assertThrows(Wire.MalformedFrame.class, () -> new Wire.Reader(buf, 0, 1).next());
  }

  @Test
  void fixedFieldsAreLittleEndian() {
    byte[] buf = new Proto().fixed64(1, 0x0102030405060708L).fixed32(2, -2).toByteArray();
    Wire.Reader reader = new Wire.Reader(buf, 0, buf.length);
    reader.next();
    assertEquals(Wire.FIXED64, reader.type);
    assertEquals(0x0102030405060708L, reader.value);
    reader.next();
    assertEquals(Wire.FIXED32, reader.type);
    assertEquals(-2, reader.value);
    assertFalse(reader.next());
    assertEquals(
        Arrays.asList((byte) 0x09, (byte) 8, (byte) 7),
        Arrays.asList(buf[0], buf[1], buf[2]));
  }
}
