package tidelog.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The options of a {@code tidelog-jvm} read, checked once on the driver (a bad option fails at
 * {@code load()}) and shipped to every task. The planner ({@code tidelog.spark.jvm.read} in
 * Python) writes them; the names are the Python source's where the meaning is the same
 * (docs/spark.md, "Reading inside the JVM").
 *
 * <ul>
 *   <li>{@code stream}: the stream (required).
 *   <li>{@code tasks}: the planned offset ranges (empty: nothing to read), one Spark task per
 *       {@code ;}-separated group,
 *       each range {@code partition:start:stop} (stop exclusive), ranges of a task separated by
 *       {@code ,} and read in that order (required).
 *   <li>{@code servers}: {@code host:port} list, tried in order (default 127.0.0.1:9292).
 *   <li>{@code leaders}: {@code partition=host:port} list: where a partition's reads go first.
 *   <li>{@code reverse}, {@code failOnDataLoss}: as the Python source.
 *   <li>{@code tls}, {@code tlsCa}, {@code tlsCert}, {@code tlsKey}, {@code token}: as the
 *       Python source; a token only over TLS.
 * </ul>
 */
final class Settings implements Serializable {
  private static final long serialVersionUID = 1L;
  static final String DEFAULT_SERVER = "127.0.0.1:9292";
  /** Records per frame asked of the server by a read without values (the Python source's
   * FRAME_MESSAGES); a read with values leaves the frame size to the server. */
  static final int FRAME_MESSAGES = 10_000;

  final String stream;
  final List<String> servers;
  final Map<Integer, String> leaders;
  final List<List<long[]>> tasks;
  final boolean reverse;
  final boolean failOnDataLoss;
  final boolean tls;
  final String tlsCa;
  final String tlsCert;
  final String tlsKey;
  final String token;

  private Settings(Map<String, String> options) {
    stream = required(options, "stream");
    servers = list(options.getOrDefault("servers", DEFAULT_SERVER), "servers");
    leaders = leaders(options.getOrDefault("leaders", ""));
    String planned = options.get("tasks");
    if (planned == null) {
      throw new IllegalArgumentException(
          "option 'tasks' is required: plan the read with tidelog.spark.jvm.read(spark, ...)"
              + " (docs/spark.md)");
    }
    tasks = tasks(planned);
    reverse = flag(options, "reverse", false);
    failOnDataLoss = flag(options, "failOnDataLoss", true);
    tlsCa = options.get("tlsCa");
    tlsCert = options.get("tlsCert");
    tlsKey = options.get("tlsKey");
    token = options.get("token");
    tls = flag(options, "tls", false) || tlsCa != null || tlsCert != null;
    if ((tlsCert == null) != (tlsKey == null)) {
      throw new IllegalArgumentException(
          "options 'tlsCert' and 'tlsKey' go together (a client certificate and its key)");
    }
    if (token != null && !tls) {
      throw new IllegalArgumentException(
          "option 'token' needs TLS (option 'tlsCa', or 'tls' = true): a token is never sent in"
              + " plaintext");
    }
  }

  /** The options as Spark hands them (keys in any case). */
  static Settings parse(Map<String, String> given) {
    Map<String, String> options = new HashMap<>();
    for (Map.Entry<String, String> entry : given.entrySet()) {
      options.put(entry.getKey().toLowerCase(Locale.ROOT), entry.getValue());
    }
    Map<String, String> named = new HashMap<>();
    for (String name :
        new String[] {
          "stream", "servers", "leaders", "tasks", "reverse", "failOnDataLoss", "tls", "tlsCa",
          "tlsCert", "tlsKey", "token"
        }) {
      String value = options.get(name.toLowerCase(Locale.ROOT));
      if (value != null) {
        named.put(name, value);
      }
    }
    return new Settings(named);
  }

  /** Where a partition's reads go, in the order tried: its leader, then every server. */
  List<String> serversFor(int partition) {
    String leader = leaders.get(partition);
    if (leader == null) {
      return servers;
    }
    List<String> order = new ArrayList<>();
    order.add(leader);
    for (String server : servers) {
      if (!server.equals(leader)) {
        order.add(server);
      }
    }
    return order;
  }

  private static String required(Map<String, String> options, String name) {
    String value = options.get(name);
    if (value == null || value.isBlank()) {
      throw new IllegalArgumentException("option '" + name + "' is required");
    }
    return value.trim();
  }

  private static boolean flag(Map<String, String> options, String name, boolean otherwise) {
    String value = options.get(name);
    if (value == null) {
      return otherwise;
    }
    switch (value.trim().toLowerCase(Locale.ROOT)) {
      case "true":
        return true;
      case "false":
        return false;
      default:
        throw new IllegalArgumentException(
            "option '" + name + "' must be true or false, not '" + value + "'");
    }
  }

  private static List<String> list(String text, String name) {
    List<String> items = new ArrayList<>();
    for (String item : text.split(",")) {
      if (!item.isBlank()) {
        items.add(address(item.trim(), name));
      }
    }
    if (items.isEmpty()) {
      throw new IllegalArgumentException("option '" + name + "' names no server");
    }
    return Collections.unmodifiableList(items);
  }

  private static String address(String text, String name) {
    int colon = text.lastIndexOf(':');
    if (colon <= 0 || colon == text.length() - 1) {
      throw new IllegalArgumentException(
          "option '" + name + "': '" + text + "' is not host:port");
    }
    parseNumber(text.substring(colon + 1), name);
    return text;
  }

  private static Map<Integer, String> leaders(String text) {
    Map<Integer, String> leaders = new HashMap<>();
    for (String item : text.split(",")) {
      if (item.isBlank()) {
        continue;
      }
      String[] parts = item.trim().split("=", 2);
      if (parts.length != 2) {
        throw new IllegalArgumentException(
            "option 'leaders': '" + item + "' is not partition=host:port");
      }
      long partition = parseNumber(parts[0], "leaders");
      if (partition > Integer.MAX_VALUE) {
        throw new IllegalArgumentException(
            "option 'leaders': partition " + partition + " is not an int32");
      }
      leaders.put((int) partition, address(parts[1].trim(), "leaders"));
    }
    return Collections.unmodifiableMap(leaders);
  }

  private static List<List<long[]>> tasks(String text) {
    List<List<long[]>> tasks = new ArrayList<>();
    for (String task : text.split(";")) {
      if (task.isBlank()) {
        continue;
      }
      List<long[]> ranges = new ArrayList<>();
      for (String range : task.split(",", -1)) { // -1: a trailing ',' is a blank range
        String[] parts = range.trim().split(":", -1);
        if (parts.length != 3) {
          throw new IllegalArgumentException(
              "option 'tasks': '" + range + "' is not partition:start:stop");
        }
        long partition = parseNumber(parts[0], "tasks");
        long start = parseNumber(parts[1], "tasks");
        long stop = parseNumber(parts[2], "tasks");
        if (partition > Integer.MAX_VALUE || stop < start) {
          throw new IllegalArgumentException(
              "option 'tasks': '" + range + "' is not partition:start:stop with start <= stop");
        }
        ranges.add(new long[] {partition, start, stop});
      }
      tasks.add(ranges);
    }
    return tasks;
  }

  private static long parseNumber(String text, String name) {
    try {
      long value = Long.parseLong(text.trim());
      if (value < 0) {
        throw new NumberFormatException();
      }
      return value;
    } catch (NumberFormatException error) {
      throw new IllegalArgumentException(
          "option '" + name + "': '" + text + "' is not a number >= 0", error);
    }
  }
}
