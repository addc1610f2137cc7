package tidelog.spark;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;

/**
 * The two protobuf messages the reader exchanges with a tidelog server, written and read by hand
 * (proto/tidelog/v1/tidelog.proto): a {@code SubscribeBatchesRequest} out, {@code RecordBatch}
 * frames in ({@link Frame#parse}). No generated code: the reader needs six request fields and the
 * frame's byte fields as positions in the received buffer, which protobuf-java would copy.
 */
final class Wire {
  private Wire() {}

  static final int START_OFFSET = 1;
  static final int START_EARLIEST = 2;
  static final int STOP_ON_CANCEL = 0;
  static final int STOP_OFFSET = 1;

  static final int VARINT = 0;
  static final int FIXED64 = 1;
  static final int LEN = 2;
  static final int FIXED32 = 5;

  /** A {@code SubscribeBatchesRequest} from offset {@code first} to {@code last}, both inclusive
   * (newest first with {@code reverse}: {@code first} is then the higher one); timestamps sent. */
  static byte[] subscribeRange(
      String stream, int partition, long first, long last, boolean reverse, int maxMessages,
      boolean withoutValues) {
    return subscribeRange(
        stream, partition, first, last, reverse, maxMessages, withoutValues, false);
  }

  /** As above; {@code withoutValues} leaves the values' sizes out too (the reader builds no
   * value column), {@code withoutTimestamps} the timestamps (a query that does not read them). */
  static byte[] subscribeRange(
      String stream, int partition, long first, long last, boolean reverse, int maxMessages,
      boolean withoutValues, boolean withoutTimestamps) {
    Writer out = new Writer();
    out.string(1, stream);
    out.varint(2, partition);
    out.varint(3, START_OFFSET);
    out.varint(4, first);
    out.varint(6, STOP_OFFSET);
    out.varint(7, last);
    out.bool(9, reverse);
    out.varint(11, maxMessages);
    out.bool(13, withoutValues);
    out.bool(14, withoutValues); // without_value_sizes
    out.bool(15, withoutTimestamps);
    return out.toByteArray();
  }

  /** A subscription newest first from the oldest retained record, one record per frame: its
   * first frame holds the oldest retained offset (none when the partition is empty). */
  static byte[] subscribeOldest(String stream, int partition) {
    Writer out = new Writer();
    out.string(1, stream);
    out.varint(2, partition);
    out.varint(3, START_EARLIEST);
    out.varint(6, STOP_ON_CANCEL);
    out.bool(9, true);
    out.varint(11, 1);
    return out.toByteArray();
  }

  /** Protobuf fields written in field order; zero values are left out, as protobuf does. */
  static final class Writer {
    private final ByteArrayOutputStream out = new ByteArrayOutputStream(64);

    void varint(int field, long value) {
      if (value != 0) {
        raw((field << 3) | VARINT);
        raw(value);
      }
    }

    void bool(int field, boolean value) {
      varint(field, value ? 1 : 0);
    }

    void string(int field, String value) {
      byte[] bytes = value.getBytes(StandardCharsets.UTF_8);
      if (bytes.length > 0) {
        raw((field << 3) | LEN);
        raw(bytes.length);
        out.write(bytes, 0, bytes.length);
      }
    }

    private void raw(long value) {
      while ((value & ~0x7FL) != 0) {
        out.write((int) ((value & 0x7F) | 0x80));
        value >>>= 7;
      }
      out.write((int) value);
    }

    byte[] toByteArray() {
      return out.toByteArray();
    }
  }

  /** Reads protobuf fields of {@code buf[from, to)} in order. */
  static final class Reader {
    private final byte[] buf;
    private int at;
    private final int end;
    int field;
    int type;
    /** The value of a varint field, or of a fixed one. */
    long value;
    /** Where a length-delimited field's bytes start, and how many. */
    int start;
    int length;

    Reader(byte[] buf, int from, int to) {
      this.buf = buf;
      this.at = from;
      this.end = to;
    }

    /** Steps to the next field; false at the end. */
    boolean next() {
      if (at >= end) {
        return false;
      }
      long tag = varint();
      field = (int) (tag >>> 3);
      type = (int) (tag & 7);
      if (field == 0) {
        throw new MalformedFrame("field number 0");
      }
      switch (type) {
        case VARINT:
          value = varint();
          break;
        case FIXED64:
          need(8);
          value = (long) Frame.LONGS.get(buf, at);
          at += 8;
          break;
        case FIXED32:
          need(4);
          value = (int) Frame.INTS.get(buf, at);
          at += 4;
          break;
        case LEN:
          long size = varint();
          if (size < 0 || size > end - at) {
            throw new MalformedFrame("a field's length runs past the frame");
          }
          start = at;
          length = (int) size;
          at += length;
          break;
        default:
          throw new MalformedFrame("unsupported wire type " + type + " (field " + field + ")");
      }
      return true;
    }

    private void need(int bytes) {
      if (end - at < bytes) {
        throw new MalformedFrame("a fixed-size field runs past the frame");
      }
    }

    private long varint() {
      long result = 0;
      for (int shift = 0; shift < 64; shift += 7) {
        if (at >= end) {
          throw new MalformedFrame("a varint runs past the frame");
        }
        byte b = buf[at++];
        result |= (long) (b & 0x7F) << shift;
        if (b >= 0) {
          return result;
        }
      }
      throw new MalformedFrame("a varint longer than 10 bytes");
    }
  }

  /** A frame that does not parse or whose columns do not fit together. */
  static final class MalformedFrame extends RuntimeException {
    private static final long serialVersionUID = 1L;

    MalformedFrame(String message) {
      super("malformed frame from the tidelog server: " + message);
    }
  }
}
