package tidelog.spark;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
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
  /** The shared channels this task holds, released when it closes. */
  private final Map<String, Connection> held = new HashMap<>();
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
    Connection connection = held.get(address);
    if (connection == null) {
      connection = Connection.shared(address, settings);
      held.put(address, connection);
    }
    return connection;
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
    for (Connection connection : held.values()) {
      connection.release();
    }
    held.clear();
  }
}
