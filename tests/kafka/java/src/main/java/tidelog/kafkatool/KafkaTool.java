package tidelog.kafkatool;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Apache Kafka's own Java client (kafka-clients) driven from the command line, for tidelog's
 * Kafka compatibility tests: the same runs against Apache Kafka and against tidelog's listener.
 *
 * <p>One subcommand per run. Output is JSON on stdout, one object per line; the client's own
 * logging (WARN and above) goes to stderr. Exit codes: 0 done, 1 a Kafka error, 2 bad usage,
 * 3 a consume that timed out before --count records (the records it got are printed).
 *
 * <pre>
 * produce --bootstrap H:P --topic T --count N [--acks all|1|0] [--compression none|gzip|snappy|lz4|zstd]
 *         [--idempotent] [--key-prefix K] [--value-prefix V] [--partition P] [--headers]
 *         [--print-acks] [--timeout-ms MS] [--config k=v ...]
 * consume --bootstrap H:P --topic T --count N [--group G] [--timeout-ms MS] [--config k=v ...]
 * admin-create --bootstrap H:P --topic T [--partitions P] [--replication-factor R]
 * admin-delete --bootstrap H:P --topic T
 * admin-list --bootstrap H:P
 * </pre>
 *
 * <p>Record i (from 0) of a produce has the value {@code <value-prefix>i} (default prefix
 * "value-"), the key {@code <key-prefix>i} when a key prefix is given (else no key) and, with
 * --headers, one header {@code seq=i}. Producers are not idempotent unless --idempotent.
 * Without --group a consume assigns itself every partition of the topic from the beginning (no
 * group coordinator involved); with it, it subscribes as a member of G from the earliest offset
 * and commits what it read before it exits.
 */
public final class KafkaTool {
  private static final int DEFAULT_TIMEOUT_MS = 30_000;

  private KafkaTool() {}

  public static void main(String[] argv) {
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
    if (argv.length == 0) {
      System.err.println("usage: kafka-tool produce|consume|admin-create|admin-delete|admin-list ...");
      System.exit(2);
    }
    int code;
    try {
      Args args = Args.parse(argv, 1);
      code =
          switch (argv[0]) {
            case "produce" -> produce(args);
            case "consume" -> consume(args);
            case "admin-create" -> adminCreate(args);
            case "admin-delete" -> adminDelete(args);
            case "admin-list" -> adminList(args);
            default -> throw new UsageError("unknown subcommand " + argv[0]);
          };
    } catch (UsageError error) {
      System.err.println("usage: " + error.getMessage());
      code = 2;
    } catch (Exception error) {
      Throwable cause = error instanceof ExecutionException ? error.getCause() : error;
      System.out.println(
          "{\"error\":" + Json.quote(cause.getClass().getName() + ": " + cause.getMessage()) + "}");
      code = 1;
    }
    System.out.flush();
    System.exit(code);
  }

  static int produce(Args args) throws Exception {
    String topic = args.required("topic");
    int count = args.integer("count", 1);
    int timeoutMs = args.integer("timeout-ms", DEFAULT_TIMEOUT_MS);
    String keyPrefix = args.optional("key-prefix", null);
    String valuePrefix = args.optional("value-prefix", "value-");
    Integer partition = args.has("partition") ? args.integer("partition", 0) : null;
    Properties config = args.clientConfig();
    config.put(ProducerConfig.ACKS_CONFIG, args.optional("acks", "all"));
    config.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, args.optional("compression", "none"));
    config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, String.valueOf(args.flag("idempotent")));
    config.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, String.valueOf(timeoutMs));
    config.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, String.valueOf(timeoutMs));
    config.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, String.valueOf(timeoutMs + 1_000));
    config.putAll(args.overrides());
    RecordMetadata[] acks = new RecordMetadata[count];
    Exception[] failures = new Exception[count];
    long started = System.nanoTime();
    try (KafkaProducer<byte[], byte[]> producer =
        new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer())) {
      for (int i = 0; i < count; i++) {
        byte[] key = keyPrefix == null ? null : utf8(keyPrefix + i);
        ProducerRecord<byte[], byte[]> record =
            new ProducerRecord<>(topic, partition, key, utf8(valuePrefix + i));
        if (args.flag("headers")) {
          record.headers().add("seq", utf8(String.valueOf(i)));
        }
        final int index = i;
        producer.send(
            record,
            (metadata, failure) -> {
              acks[index] = metadata;
              failures[index] = failure;
            });
      }
      producer.flush();
    }
    long elapsedMs = (System.nanoTime() - started) / 1_000_000;
    int failed = 0;
    String firstError = null;
    for (int i = 0; i < count; i++) {
      if (failures[i] != null) {
        failed++;
        if (firstError == null) {
          firstError = failures[i].getClass().getName() + ": " + failures[i].getMessage();
        }
      } else if (args.flag("print-acks")) {
        System.out.println(
            "{\"seq\":" + i + ",\"partition\":" + acks[i].partition() + ",\"offset\":"
                + acks[i].offset() + ",\"timestamp\":" + acks[i].timestamp() + "}");
      }
    }
    System.out.println(
        "{\"acked\":" + (count - failed) + ",\"failed\":" + failed + ",\"elapsed_ms\":" + elapsedMs
            + ",\"first_error\":" + (firstError == null ? "null" : Json.quote(firstError)) + "}");
    return failed == 0 ? 0 : 1;
  }

  static int consume(Args args) throws Exception {
    String topic = args.required("topic");
    int count = args.integer("count", 1);
    int timeoutMs = args.integer("timeout-ms", DEFAULT_TIMEOUT_MS);
    String group = args.optional("group", null);
    Properties config = args.clientConfig();
    config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    config.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, String.valueOf(timeoutMs));
    if (group != null) {
      config.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    }
    config.putAll(args.overrides());
    long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
    int seen = 0;
    try (KafkaConsumer<byte[], byte[]> consumer =
        new KafkaConsumer<>(config, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
      if (group != null) {
        consumer.subscribe(List.of(topic));
      } else {
        List<TopicPartition> partitions = new ArrayList<>();
        for (PartitionInfo info : consumer.partitionsFor(topic)) {
          partitions.add(new TopicPartition(topic, info.partition()));
        }
        consumer.assign(partitions);
        consumer.seekToBeginning(partitions);
      }
      while (seen < count) {
        long remainingMs = (deadline - System.nanoTime()) / 1_000_000;
        if (remainingMs <= 0) {
          break;
        }
        for (ConsumerRecord<byte[], byte[]> record :
            consumer.poll(Duration.ofMillis(Math.min(remainingMs, 500)))) {
          System.out.println(recordJson(record));
          seen++;
        }
      }
      if (group != null && seen > 0) {
        consumer.commitSync();
      }
    }
    return seen >= count ? 0 : 3;
  }

  static int adminCreate(Args args) throws Exception {
    String topic = args.required("topic");
    NewTopic request =
        new NewTopic(
            topic, args.integer("partitions", 1), (short) args.integer("replication-factor", 1));
    try (Admin admin = Admin.create(args.clientConfig())) {
      admin.createTopics(List.of(request)).all().get();
    }
    System.out.println("{\"created\":" + Json.quote(topic) + "}");
    return 0;
  }

  static int adminDelete(Args args) throws Exception {
    String topic = args.required("topic");
    try (Admin admin = Admin.create(args.clientConfig())) {
      admin.deleteTopics(List.of(topic)).all().get();
    }
    System.out.println("{\"deleted\":" + Json.quote(topic) + "}");
    return 0;
  }

  static int adminList(Args args) throws Exception {
    TreeSet<String> names;
    try (Admin admin = Admin.create(args.clientConfig())) {
      names = new TreeSet<>(admin.listTopics().names().get());
    }
    List<String> quoted = new ArrayList<>();
    for (String name : names) {
      quoted.add(Json.quote(name));
    }
    System.out.println("{\"topics\":[" + String.join(",", quoted) + "]}");
    return 0;
  }

  static String recordJson(ConsumerRecord<byte[], byte[]> record) {
    List<String> headers = new ArrayList<>();
    for (Header header : record.headers()) {
      headers.add("[" + Json.quote(header.key()) + "," + Json.base64(header.value()) + "]");
    }
    return "{\"topic\":" + Json.quote(record.topic()) + ",\"partition\":" + record.partition()
        + ",\"offset\":" + record.offset() + ",\"timestamp\":" + record.timestamp()
        + ",\"timestamp_type\":" + Json.quote(record.timestampType().name) + ",\"key\":"
        + Json.base64(record.key()) + ",\"value\":" + Json.base64(record.value())
        + ",\"headers\":[" + String.join(",", headers) + "]}";
  }

  static byte[] utf8(String text) {
    return text.getBytes(StandardCharsets.UTF_8);
  }

  /** A usage mistake: reported on stderr with exit code 2. */
  static final class UsageError extends RuntimeException {
    UsageError(String message) {
      super(message);
    }
  }

  /** {@code --name value} options, {@code --flag} switches and repeated {@code --config k=v}. */
  static final class Args {
    private static final List<String> FLAGS =
        List.of("idempotent", "headers", "print-acks");
    private final Map<String, String> values = new HashMap<>();
    private final Map<String, String> overrides = new HashMap<>();

    static Args parse(String[] argv, int from) {
      Args args = new Args();
      for (int i = from; i < argv.length; i++) {
        if (!argv[i].startsWith("--")) {
          throw new UsageError("unexpected argument " + argv[i]);
        }
        String name = argv[i].substring(2);
        if (FLAGS.contains(name)) {
          args.values.put(name, "true");
          continue;
        }
        if (i + 1 >= argv.length) {
          throw new UsageError("--" + name + " needs a value");
        }
        String value = argv[++i];
        if (name.equals("config")) {
          int equals = value.indexOf('=');
          if (equals <= 0) {
            throw new UsageError("--config takes key=value, not " + value);
          }
          args.overrides.put(value.substring(0, equals), value.substring(equals + 1));
        } else {
          args.values.put(name, value);
        }
      }
      return args;
    }

    boolean has(String name) {
      return values.containsKey(name);
    }

    boolean flag(String name) {
      return values.containsKey(name);
    }

    String required(String name) {
      String value = values.get(name);
      if (value == null) {
        throw new UsageError("--" + name + " is required");
      }
      return value;
    }

    String optional(String name, String fallback) {
      return values.getOrDefault(name, fallback);
    }

    int integer(String name, int fallback) {
      String value = values.get(name);
      try {
        return value == null ? fallback : Integer.parseInt(value);
      } catch (NumberFormatException error) {
        throw new UsageError("--" + name + " takes an integer, not " + value);
      }
    }

    /** bootstrap.servers and client.id: what every client needs. */
    Properties clientConfig() {
      Properties config = new Properties();
      config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, required("bootstrap"));
      config.put(AdminClientConfig.CLIENT_ID_CONFIG, "kafka-tool");
      return config;
    }

    Map<String, String> overrides() {
      return overrides;
    }
  }

  /** The little JSON this program writes: quoted strings and base64 bytes (null stays null). */
  static final class Json {
    private Json() {}

    static String base64(byte[] bytes) {
      return bytes == null ? "null" : "\"" + Base64.getEncoder().encodeToString(bytes) + "\"";
    }

    static String quote(String text) {
      if (text == null) {
        return "null";
      }
      StringBuilder out = new StringBuilder(text.length() + 2).append('"');
      for (int i = 0; i < text.length(); i++) {
        char c = text.charAt(i);
        switch (c) {
          case '"' -> out.append("\\\"");
          case '\\' -> out.append("\\\\");
          case '\n' -> out.append("\\n");
          case '\r' -> out.append("\\r");
          case '\t' -> out.append("\\t");
          default -> {
            if (c < 0x20) {
              out.append(String.format("\\u%04x", (int) c));
            } else {
              out.append(c);
            }
          }
        }
      }
      return out.append('"').toString();
    }
  }
}
