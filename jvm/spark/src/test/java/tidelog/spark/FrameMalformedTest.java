package tidelog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/**
 * Every way {@link Frame} refuses a frame, as the Python client's {@code MalformedBatch} cases
 * (tidelog/wire/arrow.py, tidelog/wire/received.py): sizes and positions that do not fit what
 * was sent, and bytes that are not a well-formed protobuf message.
 */
class FrameMalformedTest {
  /** {@code run} throws {@link Wire.MalformedFrame} saying {@code words}. */
  private static void refused(String words, Executable run) {
    Wire.MalformedFrame error = assertThrows(Wire.MalformedFrame.class, run);
    assertTrue(error.getMessage().startsWith("malformed frame from the tidelog server: "));
    assertTrue(error.getMessage().contains(words), error.getMessage());
  }

  private static void parseRefused(String words, byte[] buf) {
    refused(words, () -> Frame.parse(buf));
  }

  // -- Frame.parse and Frame.check --------------------------------------------------------------

  @Test
  void offsetsNotWholeInt64s() {
    parseRefused(
        "whole little-endian int64s",
        new Proto().bytes(1, new byte[7]).bytes(2, new byte[7]).toByteArray());
    parseRefused(
        "whole little-endian int64s",
        new Proto().bytes(1, new byte[17]).bytes(2, new byte[16]).toByteArray());
  }

  @Test
  void timestampsNotOnePerOffset() {
    parseRefused(
        "one timestamp per offset",
        new Proto().bytes(1, Proto.longs(1, 2)).bytes(2, Proto.longs(1)).toByteArray());
    parseRefused(
        "one timestamp per offset", new Proto().bytes(1, Proto.longs(1)).toByteArray());
    parseRefused(
        "one timestamp per offset", new Proto().bytes(2, Proto.longs(1)).toByteArray());
  }

  @Test
  void valueSizesOfAnotherCount() {
    parseRefused(
        "value_sizes must hold 2 u32 entries",
        Proto.frame(new Proto().string(1, "ab").bytes(2, Proto.ints(2)), 0, 1));
    parseRefused(
        "value_sizes must hold 1 u32 entries",
        Proto.frame(new Proto().string(1, "ab").bytes(2, new byte[5]), 0));
    parseRefused("value_sizes must hold 1 u32 entries", Proto.batch(0).toByteArray());
    // Without values, value_sizes still holds each record's size.
    parseRefused(
        "value_sizes must hold 2 u32 entries",
        Proto.frame(new Proto().varint(7, 1), 0, 1));
  }

  @Test
  void keysWithoutKeySizes() {
    parseRefused(
        "keys were sent without key_sizes",
        Proto.frame(Proto.values("a").string(3, "k"), 0));
  }

  @Test
  void keySizesOfAnotherCount() {
    parseRefused(
        "key_sizes must hold 2 i32 entries",
        Proto.frame(Proto.values("a", "b").string(3, "k").bytes(4, Proto.ints(1)), 0, 1));
    parseRefused(
        "key_sizes must hold 1 i32 entries",
        Proto.frame(Proto.values("a").bytes(4, Proto.ints(-1, -1)), 0));
  }

  @Test
  void headerListsOfAnotherCount() {
    parseRefused(
        "1 header lists for 2 values",
        Proto.frame(Proto.values("a", "b").message(5, Proto.headerList()), 0, 1));
    Proto three =
        Proto.values("a", "b")
            .message(5, Proto.headerList())
            .message(5, Proto.headerList())
            .message(5, Proto.headerList());
    parseRefused("3 header lists for 2 values", Proto.frame(three, 0, 1));
    // Lists that only add up to the count across two Messages are still counted together.
    byte[] merged =
        Proto.batch(0)
            .message(3, Proto.values("a").message(5, Proto.headerList()))
            .message(3, new Proto().message(5, Proto.headerList()))
            .toByteArray();
    parseRefused("2 header lists for 1 values", merged);
  }

  @Test
  void valuePositionsOfAnotherCount() {
    parseRefused(
        "value_positions must hold 2 u32 entries",
        Proto.frame(Proto.values("a", "b").bytes(6, Proto.ints(0)), 0, 1));
    parseRefused(
        "value_positions must hold 1 u32 entries",
        Proto.frame(Proto.values("a").bytes(6, new byte[3]), 0));
  }

  @Test
  void aFrameOfNoRecordsParsesButItsStrayValuesDoNotFit() {
    // A subscription's last frame may hold no records (the reader skips it): parsing it checks
    // no column's count, and a value column of it still has to fit what was sent.
    Frame frame =
        Frame.parse(new Proto().message(3, Proto.values("abc")).varint(4, 1).toByteArray());
    assertEquals(0, frame.count);
    assertEquals(1, frame.end);
    refused("value sizes add up to 0 bytes but 3 were sent", frame::valueBounds);
    Frame clean =
        Frame.parse(new Proto().message(3, new Proto().bytes(4, new byte[0])).toByteArray());
    assertArrayEquals(new int[0], clean.valueBounds());
  }

  // -- Frame.valueBounds ------------------------------------------------------------------------

  @Test
  void aValueSizeLargerThanTheValuesSent() {
    Frame frame = Frame.parse(Proto.frame(new Proto().string(1, "ab").bytes(2, Proto.ints(3)), 0));
    refused("a value's size is larger than the values sent", frame::valueBounds);
    Frame huge =
        Frame.parse(Proto.frame(new Proto().string(1, "ab").bytes(2, Proto.ints(-1, 2)), 0, 1));
    refused("a value's size is larger than the values sent", huge::valueBounds);
  }

  @Test
  void valueSizesNotAddingUpToTheValuesSent() {
    Frame less =
        Frame.parse(Proto.frame(new Proto().string(1, "abc").bytes(2, Proto.ints(1, 1)), 0, 1));
    refused("value sizes add up to 2 bytes but 3 were sent", less::valueBounds);
    Frame more =
        Frame.parse(Proto.frame(new Proto().string(1, "abc").bytes(2, Proto.ints(2, 2)), 0, 1));
    refused("value sizes add up to 4 bytes but 3 were sent", more::valueBounds);
    Frame none = Frame.parse(Proto.frame(new Proto().bytes(2, Proto.ints(0, 1)), 0, 1));
    refused("a value's size is larger than the values sent", none::valueBounds);
  }

  @Test
  void aValuePositionPastTheValuesSent() {
    Proto past =
        new Proto().string(1, "abcd").bytes(2, Proto.ints(1, 2)).bytes(6, Proto.ints(0, 3));
    refused(
        "a value position points past the values sent",
        Frame.parse(Proto.frame(past, 0, 1))::valueBounds);
    Proto start = new Proto().string(1, "abcd").bytes(2, Proto.ints(0)).bytes(6, Proto.ints(5));
    refused(
        "a value position points past the values sent",
        Frame.parse(Proto.frame(start, 0))::valueBounds);
    // A u32 position above 2^31 is past the values, not a negative offset into the buffer.
    Proto high =
        new Proto().string(1, "abcd").bytes(2, Proto.ints(1)).bytes(6, Proto.ints(0xFFFFFFFF));
    refused(
        "a value position points past the values sent",
        Frame.parse(Proto.frame(high, 0))::valueBounds);
  }

  // -- Frame.keyBounds --------------------------------------------------------------------------

  /** A frame of two records with values "a", "b", {@code keys} and {@code sizes}. */
  private static Frame keyed(String keys, int... sizes) {
    return Frame.parse(
        Proto.frame(Proto.values("a", "b").string(3, keys).bytes(4, Proto.ints(sizes)), 0, 1));
  }

  @Test
  void aKeySizeBelowMinusOne() {
    Frame frame = keyed("k", 1, -2);
    refused("a key size below -1", frame::keyBounds);
    Frame lowest =
        Frame.parse(
            Proto.frame(Proto.values("a").bytes(4, Proto.ints(Integer.MIN_VALUE)), 0));
    refused("a key size below -1", lowest::keyBounds);
  }

  @Test
  void keySizesNotAddingUpToTheKeysSent() {
    Frame less = keyed("kkk", 1, 1);
    refused("key sizes do not add up to the keys sent", less::keyBounds);
    Frame more = keyed("kk", 2, 1);
    refused("key sizes do not add up to the keys sent", more::keyBounds);
    Frame nullsWithKeys =
        Frame.parse(Proto.frame(Proto.values("a").string(3, "k").bytes(4, Proto.ints(-1)), 0));
    refused("key sizes do not add up to the keys sent", nullsWithKeys::keyBounds);
    Frame maximal = keyed("k", Integer.MAX_VALUE, 1);
    refused("key sizes do not add up to the keys sent", maximal::keyBounds);
  }

  // -- the protobuf wire format -----------------------------------------------------------------

  @Test
  void aVarintRunningPastTheFrame() {
    parseRefused("a varint runs past the frame", new byte[] {(byte) 0x80});
    parseRefused("a varint runs past the frame", new byte[] {0x20, (byte) 0xFF, (byte) 0xFF});
    // A length that is itself cut short.
    parseRefused("a varint runs past the frame", new byte[] {0x0A, (byte) 0x80});
  }

  @Test
  void aVarintLongerThanTenBytes() {
    byte[] eleven = new byte[12];
    eleven[0] = 0x20;
    for (int i = 1; i < 11; i++) {
      eleven[i] = (byte) 0x80;
    }
    eleven[11] = 0x01;
    parseRefused("a varint longer than 10 bytes", eleven);
  }

  @Test
  void aLengthRunningPastTheFrame() {
    parseRefused(
        "a field's length runs past the frame",
        new Proto().tag(1, Wire.LEN).uvarint(9).raw(new byte[8]).toByteArray());
    // A length that no int holds (and one read as a negative long).
    parseRefused(
        "a field's length runs past the frame",
        new Proto().tag(1, Wire.LEN).uvarint(1L << 40).toByteArray());
    parseRefused(
        "a field's length runs past the frame",
        new Proto().tag(1, Wire.LEN).uvarint(-1).toByteArray());
  }

  @Test
  void aNestedFieldRunsPastItsMessageNotJustTheFrame() {
    // Messages holds 3 bytes: a tag, a length of 5 and one byte; the frame goes on after it.
    byte[] buf =
        Proto.batch(0)
            .tag(3, Wire.LEN)
            .uvarint(3)
            .raw((byte) 0x0A, (byte) 5, (byte) 'a')
            .string(15, "more bytes after the message")
            .toByteArray();
    parseRefused("a field's length runs past the frame", buf);
    // A varint cut short at the message's end, the frame's bytes after it.
    byte[] varint =
        Proto.batch(0)
            .tag(3, Wire.LEN)
            .uvarint(2)
            .raw((byte) 0x38, (byte) 0x81)
            .varint(15, 1)
            .toByteArray();
    parseRefused("a varint runs past the frame", varint);
  }

  @Test
  void aFixedFieldRunningPastTheFrame() {
    parseRefused(
        "a fixed-size field runs past the frame",
        new Proto().tag(6, Wire.FIXED64).raw(new byte[7]).toByteArray());
    parseRefused(
        "a fixed-size field runs past the frame",
        new Proto().tag(6, Wire.FIXED32).raw(new byte[3]).toByteArray());
    byte[] nested =
        Proto.batch(0)
            .tag(3, Wire.LEN)
            .uvarint(5)
            .raw((byte) 0x41, (byte) 1, (byte) 2, (byte) 3, (byte) 4)
            .string(15, "eight more")
            .toByteArray();
    parseRefused("a fixed-size field runs past the frame", nested);
  }

  @Test
  void groupsAndTheWireTypesThatDoNotExist() {
    for (int type : new int[] {3, 4, 6, 7}) {
      parseRefused(
          "unsupported wire type " + type + " (field 9)",
          new Proto().tag(9, type).raw(new byte[16]).toByteArray());
      // Inside Messages too.
      byte[] nested =
          Proto.frame(Proto.values("a").tag(8, type).raw(new byte[8]), 0);
      parseRefused("unsupported wire type " + type + " (field 8)", nested);
    }
  }

  @Test
  void fieldNumberZero() {
    parseRefused("field number 0", new byte[] {0x00, 0x00});
    parseRefused("field number 0", new byte[] {0x02, 0x00});
  }

  @Test
  void aMalformedHeaderListIsRefusedWhenTheHeadersAreRead() {
    // A HeaderList whose Header's length runs past the list (within the frame).
    Proto bad = new Proto().tag(1, Wire.LEN).uvarint(4).raw((byte) 0x0A);
    Frame frame =
        Frame.parse(Proto.frame(Proto.values("a").message(5, bad).string(15, "xxxxxxxx"), 0));
    refused("a field's length runs past the frame", frame::headers);
    // A Header whose name is a group.
    Proto group = Proto.headerList(new Proto().tag(1, 3));
    Frame grouped = Frame.parse(Proto.frame(Proto.values("a").message(5, group), 0));
    refused("unsupported wire type 3 (field 1)", grouped::headers);
  }
}
