package tidelog.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * One {@code RecordBatch} frame as received: its columns are positions in the received buffer,
 * which the column vectors ({@link Columns}) read in place. Checked as the Python client checks a
 * frame (tidelog/wire/arrow.py): every size and position must fit inside what was sent.
 *
 * <p>Protobuf's rules for a field sent twice hold: a later bytes field replaces an earlier one,
 * a later {@code messages} merges into the earlier, header lists append.
 */
final class Frame {
  static final VarHandle LONGS =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  static final VarHandle INTS =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

  final byte[] buf;
  /** Records in the frame. */
  final int count;
  final int offsetsAt;
  final int timestampsAt;
  /** {@code EndReason}: non-zero on a subscription's last frame. */
  final int end;

  private final Span values = new Span();
  private final Span valueSizes = new Span();
  private final Span keys = new Span();
  private final Span keySizes = new Span();
  private final Span valuePositions = new Span();
  private boolean valuesOmitted;
  private boolean valueSizesOmitted;
  private boolean timestampsOmitted;
  private int[] headerStarts = new int[0];
  private int[] headerLengths = new int[0];
  private int headerLists;

  private Frame(byte[] buf, int count, int offsetsAt, int timestampsAt, int end) {
    this.buf = buf;
    this.count = count;
    this.offsetsAt = offsetsAt;
    this.timestampsAt = timestampsAt;
    this.end = end;
  }

  /** Where a bytes field lies in the buffer; absent = empty. */
  private static final class Span {
    int start;
    int length;

    void set(Wire.Reader field) {
      start = field.start;
      length = field.length;
    }
  }

  static Frame parse(byte[] buf) {
    Span offsets = new Span();
    Span timestamps = new Span();
    int end = 0;
    boolean untimed = false;
    Wire.Reader batch = new Wire.Reader(buf, 0, buf.length);
    int[] messages = new int[0];
    while (batch.next()) {
      if (batch.field == 1 && batch.type == Wire.LEN) {
        offsets.set(batch);
      } else if (batch.field == 2 && batch.type == Wire.LEN) {
        timestamps.set(batch);
      } else if (batch.field == 3 && batch.type == Wire.LEN) {
        messages = Arrays.copyOf(messages, messages.length + 2);
        messages[messages.length - 2] = batch.start;
        messages[messages.length - 1] = batch.length;
      } else if (batch.field == 4 && batch.type == Wire.VARINT) {
        end = (int) batch.value;
      } else if (batch.field == 5 && batch.type == Wire.VARINT) {
        untimed = batch.value != 0;
      }
    }
    if (offsets.length % 8 != 0) {
      throw new Wire.MalformedFrame("offsets must be whole little-endian int64s");
    }
    int count = offsets.length / 8;
    if (untimed ? timestamps.length != 0 : timestamps.length != offsets.length) {
      throw new Wire.MalformedFrame(
          untimed ? "timestamps sent in a frame that says they were omitted"
              : "one timestamp per offset");
    }
    Frame frame = new Frame(buf, count, offsets.start, timestamps.start, end);
    frame.timestampsOmitted = untimed;
    for (int i = 0; i < messages.length; i += 2) {
      frame.readMessages(messages[i], messages[i] + messages[i + 1]);
    }
    frame.check();
    return frame;
  }

  private void readMessages(int from, int to) {
    Wire.Reader field = new Wire.Reader(buf, from, to);
    while (field.next()) {
      if (field.type == Wire.LEN) {
        switch (field.field) {
          case 1 -> values.set(field);
          case 2 -> valueSizes.set(field);
          case 3 -> keys.set(field);
          case 4 -> keySizes.set(field);
          case 5 -> addHeaderList(field.start, field.length);
          case 6 -> valuePositions.set(field);
          default -> { }
        }
      } else if (field.field == 7 && field.type == Wire.VARINT) {
        valuesOmitted = field.value != 0;
      } else if (field.field == 8 && field.type == Wire.VARINT) {
        valueSizesOmitted = field.value != 0;
      }
    }
  }

  private void addHeaderList(int start, int length) {
    if (headerLists == headerStarts.length) {
      int grown = Math.max(16, headerLists * 2);
      headerStarts = Arrays.copyOf(headerStarts, grown);
      headerLengths = Arrays.copyOf(headerLengths, grown);
    }
    headerStarts[headerLists] = start;
    headerLengths[headerLists] = length;
    headerLists++;
  }

  private void check() {
    if (count == 0) {
      return;
    }
    if (valueSizesOmitted && !valuesOmitted) {
      throw new Wire.MalformedFrame("value sizes omitted from a frame with values");
    }
    if (valueSizes.length != (valueSizesOmitted ? 0 : 4 * count)) {
      throw new Wire.MalformedFrame(
          valueSizesOmitted ? "value sizes sent in a frame that says they were omitted"
              : "value_sizes must hold " + count + " u32 entries");
    }
    if (keys.length > 0 && keySizes.length == 0) {
      throw new Wire.MalformedFrame("keys were sent without key_sizes");
    }
    if (keySizes.length != 0 && keySizes.length != 4 * count) {
      throw new Wire.MalformedFrame("key_sizes must hold " + count + " i32 entries");
    }
    if (headerLists != 0 && headerLists != count) {
      throw new Wire.MalformedFrame(headerLists + " header lists for " + count + " values");
    }
    if (!valuesOmitted && valuePositions.length != 0 && valuePositions.length != 4 * count) {
      throw new Wire.MalformedFrame("value_positions must hold " + count + " u32 entries");
    }
  }

  long offset(int i) {
    return (long) LONGS.get(buf, offsetsAt + 8 * i);
  }

  long timestampNanos(int i) {
    return (long) LONGS.get(buf, timestampsAt + 8 * i);
  }

  /** Whether the frame came without timestamps (the subscription asked so). */
  boolean timestampsOmitted() {
    return timestampsOmitted;
  }

  /** The first offset delivered (the highest, newest first). */
  long firstOffset() {
    return offset(0);
  }

  long lastOffset() {
    return offset(count - 1);
  }

  boolean valuesOmitted() {
    return valuesOmitted;
  }

  /** Each value's start in {@link #buf} and size: {@code [starts..., sizes...]}. */
  int[] valueBounds() {
    if (valuesOmitted) {
      throw new Wire.MalformedFrame("a frame read without values has no value column");
    }
    int[] bounds = new int[2 * count];
    long total = 0;
    for (int i = 0; i < count; i++) {
      long size = Integer.toUnsignedLong((int) INTS.get(buf, valueSizes.start + 4 * i));
      if (size > values.length) {
        throw new Wire.MalformedFrame("a value's size is larger than the values sent");
      }
      bounds[count + i] = (int) size;
      total += size;
    }
    if (valuePositions.length == 0) {
      if (total != values.length) {
        throw new Wire.MalformedFrame(
            "value sizes add up to " + total + " bytes but " + values.length + " were sent");
      }
      int at = values.start;
      for (int i = 0; i < count; i++) {
        bounds[i] = at;
        at += bounds[count + i];
      }
    } else {
      for (int i = 0; i < count; i++) {
        long start = Integer.toUnsignedLong((int) INTS.get(buf, valuePositions.start + 4 * i));
        if (start + bounds[count + i] > values.length) {
          throw new Wire.MalformedFrame("a value position points past the values sent");
        }
        bounds[i] = values.start + (int) start;
      }
    }
    return bounds;
  }

  /** Each key's start and size ({@code -1}: no key), as {@link #valueBounds}; null when no
   * record of the frame has a key. */
  int[] keyBounds() {
    if (keySizes.length == 0) {
      return null;
    }
    int[] bounds = new int[2 * count];
    long at = keys.start;
    for (int i = 0; i < count; i++) {
      int size = (int) INTS.get(buf, keySizes.start + 4 * i);
      if (size < -1) {
        throw new Wire.MalformedFrame("a key size below -1");
      }
      bounds[i] = (int) Math.min(at, Integer.MAX_VALUE);
      bounds[count + i] = size;
      at += Math.max(size, 0);
    }
    if (at - keys.start != keys.length) {
      throw new Wire.MalformedFrame("key sizes do not add up to the keys sent");
    }
    return bounds;
  }

  /** Every record's headers, or null when no record of the frame has any. */
  Headers headers() {
    if (headerLists == 0) {
      return null;
    }
    return Headers.read(buf, count, headerStarts, headerLengths);
  }

  /** A frame's headers flattened: record i has entries {@code first[i] .. first[i+1]-1}, each
   * a name and a value as positions in the buffer. */
  static final class Headers {
    final int[] first;
    final int[] nameStarts;
    final int[] nameLengths;
    final int[] valueStarts;
    final int[] valueLengths;

    private Headers(int[] first, int entries) {
      this.first = first;
      this.nameStarts = new int[entries];
      this.nameLengths = new int[entries];
      this.valueStarts = new int[entries];
      this.valueLengths = new int[entries];
    }

    static Headers read(byte[] buf, int count, int[] starts, int[] lengths) {
      int[] first = new int[count + 1];
      int entries = 0;
      for (int i = 0; i < count; i++) {
        first[i] = entries;
        Wire.Reader list = new Wire.Reader(buf, starts[i], starts[i] + lengths[i]);
        while (list.next()) {
          if (list.field == 1 && list.type == Wire.LEN) {
            entries++;
          }
        }
      }
      first[count] = entries;
      Headers headers = new Headers(first, entries);
      int entry = 0;
      for (int i = 0; i < count; i++) {
        Wire.Reader list = new Wire.Reader(buf, starts[i], starts[i] + lengths[i]);
        while (list.next()) {
          if (list.field == 1 && list.type == Wire.LEN) {
            headers.readHeader(buf, entry++, list.start, list.start + list.length);
          }
        }
      }
      return headers;
    }

    private void readHeader(byte[] buf, int entry, int from, int to) {
      Wire.Reader field = new Wire.Reader(buf, from, to);
      while (field.next()) {
        if (field.field == 1 && field.type == Wire.LEN) {
          nameStarts[entry] = field.start;
          nameLengths[entry] = field.length;
        } else if (field.field == 2 && field.type == Wire.LEN) {
          valueStarts[entry] = field.start;
          valueLengths[entry] = field.length;
        }
      }
    }
  }
}
