package tidelog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.junit.jupiter.api.Test;

/**
 * {@link Frame} over well-formed {@code RecordBatch} frames: the columns it finds where they lie,
 * and protobuf's rules for fields sent twice, unknown fields and wrong wire types.
 */
class FrameTest {
  /** Value {@code i} as text, from {@link Frame#valueBounds}. */
  private static String value(Frame frame, int[] bounds, int i) {
    return new String(frame.buf, bounds[i], bounds[frame.count + i], StandardCharsets.UTF_8);
  }

  private static String[] values(Frame frame) {
    int[] bounds = frame.valueBounds();
    String[] got = new String[frame.count];
    for (int i = 0; i < frame.count; i++) {
      got[i] = value(frame, bounds, i);
    }
    return got;
  }

  /** Each key as text, null for a record without one; null when no record has a key. */
  private static String[] keys(Frame frame) {
    int[] bounds = frame.keyBounds();
    if (bounds == null) {
      return null;
    }
    String[] got = new String[frame.count];
    for (int i = 0; i < frame.count; i++) {
      int size = bounds[frame.count + i];
      got[i] = size < 0 ? null : new String(frame.buf, bounds[i], size, StandardCharsets.UTF_8);
    }
    return got;
  }

  /** Each record's headers as "name=value" strings. */
  private static String[][] headers(Frame frame) {
    Frame.Headers headers = frame.headers();
    String[][] got = new String[frame.count][];
    for (int i = 0; i < frame.count; i++) {
      got[i] = new String[headers.first[i + 1] - headers.first[i]];
      for (int e = headers.first[i]; e < headers.first[i + 1]; e++) {
        String name =
            new String(
                frame.buf, headers.nameStarts[e], headers.nameLengths[e], StandardCharsets.UTF_8);
        String value =
            new String(
                frame.buf, headers.valueStarts[e], headers.valueLengths[e], StandardCharsets.UTF_8);
        got[i][e - headers.first[i]] = name + "=" + value;
      }
    }
    return got;
  }

  @Test
  void offsetsAndTimestampsAreLittleEndianInt64s() {
    byte[] offsets = {8, 7, 6, 5, 4, 3, 2, 1, (byte) 0xFF, 0, 0, 0, 0, 0, 0, 0};
    byte[] timestamps = {
      1, 0, 0, 0, 0, 0, 0, (byte) 0x80, (byte) 0xFE, (byte) 0xFF, (byte) 0xFF, (byte) 0xFF,
      (byte) 0xFF, (byte) 0xFF, (byte) 0xFF, (byte) 0xFF
    };
    byte[] buf =
        new Proto()
            .bytes(1, offsets)
            .bytes(2, timestamps)
            .message(3, Proto.values("a", "b"))
            .toByteArray();
    Frame frame = Frame.parse(buf);
    assertEquals(2, frame.count);
    assertEquals(0x0102030405060708L, frame.offset(0));
    assertEquals(255L, frame.offset(1));
    assertEquals(0x0102030405060708L, frame.firstOffset());
    assertEquals(255L, frame.lastOffset());
    assertEquals(Long.MIN_VALUE + 1, frame.timestampNanos(0));
    assertEquals(-2L, frame.timestampNanos(1));
    assertEquals(0, frame.end);
  }

  @Test
  void descendingOffsetsOfAReverseRead() {
    Frame frame = Frame.parse(Proto.frame(Proto.values("c", "b", "a"), 12, 11, 10));
    assertEquals(12, frame.firstOffset());
    assertEquals(10, frame.lastOffset());
    assertArrayEquals(new String[] {"c", "b", "a"}, values(frame));
  }

  @Test
  void anEmptyFrameAndTheLastFrameOfASubscription() {
    Frame empty = Frame.parse(new byte[0]);
    assertEquals(0, empty.count);
    assertEquals(0, empty.end);
    assertEquals(0, empty.valueBounds().length);
    assertNull(empty.keyBounds());
    assertNull(empty.headers());

    Frame last = Frame.parse(new Proto().varint(4, 2).toByteArray());
    assertEquals(0, last.count);
    assertEquals(2, last.end);
  }

  @Test
  void theEndReasonIsTheVarintsLow32BitsAsProtobufReadsAnEnum() {
    Frame frame = Frame.parse(new Proto().varint(4, (1L << 32) | 3).toByteArray());
    assertEquals(3, frame.end);
    assertEquals(-1, Frame.parse(new Proto().varint(4, -1).toByteArray()).end);
  }

  @Test
  void valuesBackToBack() {
    Frame frame = Frame.parse(Proto.frame(Proto.values("abc", "", "défgh"), 0, 1, 2));
    int[] bounds = frame.valueBounds();
    assertEquals(6, bounds.length);
    assertEquals(bounds[0] + 3, bounds[1]);
    assertEquals(bounds[1], bounds[2]);
    assertArrayEquals(new int[] {3, 0, 6}, Arrays.copyOfRange(bounds, 3, 6));
    assertArrayEquals(new String[] {"abc", "", "défgh"}, values(frame));
    assertFalse(frame.valuesOmitted());
  }

  @Test
  void valuesThroughValuePositionsInAnyOrderAndOverlapping() {
    // values "..abc..defgh.", positions of "defgh", "abc", "", "bc" and "" at the very end.
    Proto messages =
        new Proto()
            .string(1, "..abc..defgh.")
            .bytes(2, Proto.ints(5, 3, 0, 2, 0))
            .bytes(6, Proto.ints(7, 2, 0, 3, 13));
    Frame frame = Frame.parse(Proto.frame(messages, 0, 1, 2, 3, 4));
    assertArrayEquals(new String[] {"defgh", "abc", "", "bc", ""}, values(frame));
  }

  @Test
  void valueSizesAreUnsigned32BitIntegers() {
    // 0x80000000 would be negative as an int32: larger than the values sent, not "no value".
    Proto messages = new Proto().string(1, "ab").bytes(2, Proto.ints(0x80000000, 2));
    Frame frame = Frame.parse(Proto.frame(messages, 0, 1));
    Wire.MalformedFrame error = assertThrows(Wire.MalformedFrame.class, frame::valueBounds);
    assertTrue(error.getMessage().contains("larger than the values sent"), error.getMessage());
  }

  @Test
  void nullKeysAreSizeMinusOneAndEmptyKeysSizeZero() {
    Proto messages =
        Proto.values("v0", "v1", "v2", "v3").string(3, "kéyb").bytes(4, Proto.ints(-1, 0, 4, 1));
    Frame frame = Frame.parse(Proto.frame(messages, 0, 1, 2, 3));
    assertArrayEquals(new String[] {null, "", "kéy", "b"}, keys(frame));
    int[] bounds = frame.keyBounds();
    assertEquals(-1, bounds[4]);
    assertEquals(0, bounds[5]);
  }

  @Test
  void aFrameWithoutKeySizesHasNoKeys() {
    Frame frame = Frame.parse(Proto.frame(Proto.values("a", "b"), 0, 1));
    assertNull(frame.keyBounds());
    // Every key null but sent as sizes: bounds, each -1.
    Frame nulls =
        Frame.parse(Proto.frame(Proto.values("a", "b").bytes(4, Proto.ints(-1, -1)), 0, 1));
    assertArrayEquals(new String[] {null, null}, keys(nulls));
  }

  @Test
  void aFrameWithoutHeaderListsHasNoHeaders() {
    Frame frame = Frame.parse(Proto.frame(Proto.values("a", "b"), 0, 1));
    assertNull(frame.headers());
  }

  @Test
  void headersOfEachRecordInOrder() {
    Proto messages =
        Proto.values("a", "b", "c", "d")
            .message(
                5, Proto.headerList(Proto.header("h1", "v1"), Proto.header("h2", "v2")))
            .message(5, Proto.headerList())
            .message(5, Proto.headerList(Proto.header("", ""), Proto.header("n", "")))
            .message(5, Proto.headerList(Proto.header("", "only-value")));
    Frame frame = Frame.parse(Proto.frame(messages, 0, 1, 2, 3));
    Frame.Headers headers = frame.headers();
    assertArrayEquals(new int[] {0, 2, 2, 4, 5}, headers.first);
    assertArrayEquals(
        new String[][] {{"h1=v1", "h2=v2"}, {}, {"=", "n="}, {"=only-value"}}, headers(frame));
  }

  @Test
  void headerFieldsLeftOutAreEmpty() {
    // A Header with neither field, one with only a value, a HeaderList of one empty Header.
    Proto messages =
        Proto.values("a", "b")
            .message(5, Proto.headerList(new Proto(), new Proto().string(2, "v")))
            .message(5, Proto.headerList(new Proto()));
    Frame frame = Frame.parse(Proto.frame(messages, 0, 1));
    assertArrayEquals(new String[][] {{"=", "=v"}, {"="}}, headers(frame));
  }

  @Test
  void valuesOmittedFrameHasSizesButNoValueColumn() {
    Proto messages =
        new Proto().bytes(2, Proto.ints(100, 0, 7)).varint(7, 1).bytes(4, Proto.ints(-1, 1, -1))
            .string(3, "k");
    Frame frame = Frame.parse(Proto.frame(messages, 5, 6, 7));
    assertTrue(frame.valuesOmitted());
    assertEquals(3, frame.count);
    Wire.MalformedFrame error = assertThrows(Wire.MalformedFrame.class, frame::valueBounds);
    assertTrue(error.getMessage().contains("without values"), error.getMessage());
    assertArrayEquals(new String[] {null, "k", null}, keys(frame));
  }

  @Test
  void valuesOmittedIgnoresValuePositions() {
    Proto messages = new Proto().bytes(2, Proto.ints(1, 2)).varint(7, 1).bytes(6, Proto.ints(9));
    assertTrue(Frame.parse(Proto.frame(messages, 0, 1)).valuesOmitted());
  }

  @Test
  void repeatedMessagesFieldsMerge() {
    // Values in the first Messages, keys and a header list in the second, a header list in the
    // third: one Messages with all of them, header lists appended in order.
    byte[] buf =
        Proto.batch(0, 1)
            .message(3, Proto.values("a", "bc"))
            .message(
                3,
                new Proto()
                    .string(3, "k")
                    .bytes(4, Proto.ints(1, -1))
                    .message(5, Proto.headerList(Proto.header("x", "1"))))
            .message(3, new Proto().message(5, Proto.headerList()))
            .toByteArray();
    Frame frame = Frame.parse(buf);
    assertArrayEquals(new String[] {"a", "bc"}, values(frame));
    assertArrayEquals(new String[] {"k", null}, keys(frame));
    assertArrayEquals(new String[][] {{"x=1"}, {}}, headers(frame));
  }

  @Test
  void aLaterMessagesReplacesTheBytesFieldsItSends() {
    byte[] buf =
        Proto.batch(0, 1)
            .message(3, Proto.values("old", "older").string(3, "kk").bytes(4, Proto.ints(1, 1)))
            .message(3, Proto.values("n", "ew"))
            .toByteArray();
    Frame frame = Frame.parse(buf);
    assertArrayEquals(new String[] {"n", "ew"}, values(frame));
    assertArrayEquals(new String[] {"k", "k"}, keys(frame));
  }

  @Test
  void aLaterBytesFieldReplacesAnEarlierOne() {
    byte[] buf =
        new Proto()
            .bytes(1, Proto.longs(1, 2, 3))
            .bytes(2, Proto.longs(10, 20))
            .bytes(1, Proto.longs(7, 8))
            .message(
                3,
                new Proto()
                    .string(1, "xyz")
                    .bytes(2, Proto.ints(3))
                    .string(1, "pq")
                    .bytes(2, Proto.ints(1, 1))
                    .bytes(4, Proto.ints(0, 0))
                    .string(3, "ignored")
                    .bytes(4, Proto.ints(-1, -1))
                    .string(3, ""))
            .varint(4, 1)
            .varint(4, 3)
            .toByteArray();
    Frame frame = Frame.parse(buf);
    assertEquals(2, frame.count);
    assertEquals(7, frame.offset(0));
    assertEquals(8, frame.offset(1));
    assertEquals(20, frame.timestampNanos(1));
    assertArrayEquals(new String[] {"p", "q"}, values(frame));
    assertArrayEquals(new String[] {null, null}, keys(frame));
    assertEquals(3, frame.end);
  }

  @Test
  void aLaterValuesOmittedReplacesAnEarlierOne() {
    Proto messages = Proto.values("a").varint(7, 1).varint(7, 0);
    assertFalse(Frame.parse(Proto.frame(messages, 0)).valuesOmitted());
    Proto omitted = new Proto().bytes(2, Proto.ints(1)).varint(7, 0).varint(7, 5);
    assertTrue(Frame.parse(Proto.frame(omitted, 0)).valuesOmitted());
  }

  @Test
  void unknownFieldsOfEveryWireTypeAreSkipped() {
    Proto header =
        Proto.header("n", "v").varint(3, 9).fixed64(4, -1).fixed32(5, 1).string(15, "?");
    Proto list = Proto.headerList(header).varint(2, 1).fixed32(3, 7).string(4, "unknown");
    Proto messages =
        Proto.values("a")
            .varint(12, 1)
            .fixed64(9, 2)
            .fixed32(10, 3)
            .string(11, "x")
            .message(5, list)
            .string(1000, "far");
    byte[] buf =
        new Proto()
            .varint(9, 12345678901L)
            .fixed64(6, 1)
            .bytes(1, Proto.longs(4))
            .fixed32(7, 2)
            .string(8, "unknown")
            .bytes(2, Proto.longs(40))
            .message(3, messages)
            .string(536870911, "highest field number")
            .toByteArray();
    Frame frame = Frame.parse(buf);
    assertEquals(1, frame.count);
    assertEquals(4, frame.offset(0));
    assertEquals(40, frame.timestampNanos(0));
    assertArrayEquals(new String[] {"a"}, values(frame));
    assertArrayEquals(new String[][] {{"n=v"}}, headers(frame));
  }

  @Test
  void aKnownFieldWithAnotherWireTypeIsSkippedAsUnknown() {
    // As protobuf does: offsets as a varint, messages as a fixed64, values_omitted as bytes.
    byte[] buf =
        Proto.batch(3)
            .varint(1, 99)
            .fixed64(3, 5)
            .message(3, Proto.values("v").string(7, "x").fixed32(1, 4))
            .string(4, "end")
            .toByteArray();
    Frame frame = Frame.parse(buf);
    assertEquals(1, frame.count);
    assertEquals(3, frame.offset(0));
    assertFalse(frame.valuesOmitted());
    assertArrayEquals(new String[] {"v"}, values(frame));
    assertEquals(0, frame.end);
  }

  @Test
  void aFrameWithoutTimestampsOrValueSizesSaysSo() {
    Proto messages = new Proto().varint(7, 1).varint(8, 1);
    byte[] buf =
        new Proto().bytes(1, Proto.longs(3, 4)).message(3, messages).varint(5, 1).toByteArray();
    Frame frame = Frame.parse(buf);
    assertEquals(2, frame.count);
    assertTrue(frame.timestampsOmitted());
    assertTrue(frame.valuesOmitted());
    assertEquals(4, frame.lastOffset());
    assertThrows(Wire.MalformedFrame.class, frame::valueBounds);
  }

  @Test
  void omittedColumnsThatWereSentAnywayAreMalformed() {
    Proto bare = new Proto().varint(7, 1).varint(8, 1);
    byte[] timed =
        Proto.batch(3, 4).message(3, bare).varint(5, 1).toByteArray(); // timestamps sent
    assertThrows(Wire.MalformedFrame.class, () -> Frame.parse(timed));
    Proto sized = new Proto().bytes(2, Proto.ints(1, 1)).varint(7, 1).varint(8, 1);
    assertThrows(Wire.MalformedFrame.class, () -> Frame.parse(Proto.frame(sized, 3, 4)));
    Proto valued = Proto.values("a", "b").varint(8, 1); // sizes omitted beside values
    assertThrows(Wire.MalformedFrame.class, () -> Frame.parse(Proto.frame(valued, 3, 4)));
  }
}
