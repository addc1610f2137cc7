package tidelog.spark;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/**
 * The tests' protobuf writer: unlike {@link Wire.Writer} it writes every field it is given, zero
 * values and empty bytes included, in the order given, and can write what protobuf never would
 * (a bare tag, a wrong wire type, raw bytes), so a test can build any frame, well-formed or not.
 * Also the little-endian columns a {@code RecordBatch} carries, and whole frames from them.
 */
final class Proto {
  private final ByteArrayOutputStream out = new ByteArrayOutputStream();

  /** A field's tag alone (what follows is up to the caller). */
  Proto tag(int field, int type) {
    return uvarint(((long) field << 3) | type);
  }

  Proto varint(int field, long value) {
    return tag(field, Wire.VARINT).uvarint(value);
  }

  Proto bytes(int field, byte[] value) {
    tag(field, Wire.LEN).uvarint(value.length);
    return raw(value);
  }

  Proto string(int field, String value) {
    return bytes(field, utf8(value));
  }

  Proto message(int field, Proto value) {
    return bytes(field, value.toByteArray());
  }

  Proto fixed64(int field, long value) {
    tag(field, Wire.FIXED64);
    return raw(longs(value));
  }

  Proto fixed32(int field, int value) {
    tag(field, Wire.FIXED32);
    return raw(ints(value));
  }

  /** A base-128 varint, without a tag. */
  Proto uvarint(long value) {
    while ((value & ~0x7FL) != 0) {
      out.write((int) ((value & 0x7F) | 0x80));
      value >>>= 7;
    }
    out.write((int) value);
    return this;
  }

  Proto raw(byte... value) {
    out.write(value, 0, value.length);
    return this;
  }

  byte[] toByteArray() {
    return out.toByteArray();
  }

  static byte[] utf8(String text) {
    return text.getBytes(StandardCharsets.UTF_8);
  }

  /** Little-endian int64s. */
  static byte[] longs(long... values) {
    ByteBuffer buf = ByteBuffer.allocate(8 * values.length).order(ByteOrder.LITTLE_ENDIAN);
    for (long value : values) {
      buf.putLong(value);
    }
    return buf.array();
  }

  /** Little-endian int32s (and u32s, as their bits). */
  static byte[] ints(int... values) {
    ByteBuffer buf = ByteBuffer.allocate(4 * values.length).order(ByteOrder.LITTLE_ENDIAN);
    for (int value : values) {
      buf.putInt(value);
    }
    return buf.array();
  }

  /** {@code RecordBatch.offsets} and {@code timestamps} (ns = offset here) for {@code offsets}. */
  static Proto batch(long... offsets) {
    return new Proto().bytes(1, longs(offsets)).bytes(2, longs(offsets));
  }

  /** A {@code RecordBatch} of {@code offsets} (timestamps equal to them) and one {@code
   * Messages}. */
  static byte[] frame(Proto messages, long... offsets) {
    return batch(offsets).message(3, messages).toByteArray();
  }

  /** A {@code Messages} with {@code values} back to back. */
  static Proto values(String... values) {
    int[] sizes = new int[values.length];
    StringBuilder all = new StringBuilder();
    for (int i = 0; i < values.length; i++) {
      sizes[i] = utf8(values[i]).length;
      all.append(values[i]);
    }
    return new Proto().string(1, all.toString()).bytes(2, ints(sizes));
  }

  /** A {@code Header}. */
  static Proto header(String name, String value) {
    return new Proto().string(1, name).string(2, value);
  }

  /** A {@code HeaderList} of {@code headers}. */
  static Proto headerList(Proto... headers) {
    Proto list = new Proto();
    for (Proto header : headers) {
      list.message(1, header);
    }
    return list;
  }
}
