package tidelog.spark;

import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The {@code tidelog-jvm} batch source: reads planned offset ranges of a tidelog stream inside
 * Spark's JVM and hands Spark columnar batches, only of the columns the query reads (Spark prunes
 * them: a {@code count()} reads no column at all, and a query without {@code value} asks the
 * server for no value bytes). Planning stays in Python ({@code tidelog.spark.jvm.read}), the one
 * implementation of the Python source's offset, timestamp and partition options.
 */
public final class TidelogSource implements TableProvider, DataSourceRegister {
  @Override
  public String shortName() {
    return "tidelog-jvm";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return Columns.SCHEMA;
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true; // a user-specified schema: any of the columns, as the Python source
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> options) {
    Columns.check(schema);
    return new StreamTable(schema, Settings.parse(options));
  }

  private static final class StreamTable implements Table, SupportsRead {
    private final StructType schema;
    private final Settings settings;

    StreamTable(StructType schema, Settings settings) {
      this.schema = schema;
      this.settings = settings;
    }

    @Override
    public String name() {
      return "tidelog:" + settings.stream;
    }

    @Override
    @Deprecated // Spark 4 asks for columns(), which by default derives them from schema()
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new StreamScan(schema, settings);
    }
  }

  private static final class StreamScan
      implements ScanBuilder, SupportsPushDownRequiredColumns, Scan, Batch {
    private StructType schema;
    private final Settings settings;

    StreamScan(StructType schema, Settings settings) {
      this.schema = schema;
      this.settings = settings;
    }

    /**
     * Spark hands the columns the query reads, with nested fields pruned too (a query of
     * {@code headers.value} asks for {@code headers: array<struct<value>>}); the connector
     * prunes whole columns only and keeps each one's full type, so the vectors it builds match
     * the schema it reports, and Spark selects the nested field itself.
     */
    @Override
    public void pruneColumns(StructType required) {
      StructType full = new StructType();
      for (String name : required.fieldNames()) {
        full = full.add(schema.apply(name));
      }
      schema = full;
    }

    @Override
    public Scan build() {
      return this;
    }

    @Override
    public StructType readSchema() {
      return schema;
    }

    @Override
    public String description() {
      return "tidelog " + settings.stream + " " + List.of(schema.fieldNames());
    }

    @Override
    public Batch toBatch() {
      return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
      InputPartition[] tasks = new InputPartition[settings.tasks.size()];
      for (int i = 0; i < tasks.length; i++) {
        tasks[i] = new Task(settings.tasks.get(i));
      }
      return tasks;
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new Readers(settings, schema);
    }
  }

  /** One Spark task's ranges ({@code partition, start, stop}), read in order. */
  private static final class Task implements InputPartition {
    private static final long serialVersionUID = 1L;
    final List<long[]> ranges;

    Task(List<long[]> ranges) {
      this.ranges = ranges;
    }
  }

  private static final class Readers implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final Settings settings;
    private final StructType schema;

    Readers(Settings settings, StructType schema) {
      this.settings = settings;
      this.schema = schema;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      return new FrameReader(settings, ((Task) partition).ranges, schema);
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("tidelog-jvm reads columnar batches only");
    }
  }
}
