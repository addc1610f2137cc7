package tidelog.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** {@link Settings#parse}: the options of a {@code tidelog-jvm} read, and every refusal. */
class SettingsTest {
  /** Options from alternating names and values, with a stream and no task unless given. */
  private static Map<String, String> options(String... pairs) {
    Map<String, String> options = new HashMap<>();
    options.put("stream", "s");
    options.put("tasks", "");
    for (int i = 0; i < pairs.length; i += 2) {
      if (pairs[i + 1] == null) {
        options.remove(pairs[i]);
      } else {
        options.put(pairs[i], pairs[i + 1]);
      }
    }
    return options;
  }

  private static Settings parse(String... pairs) {
    return Settings.parse(options(pairs));
  }

  /** Parsing refuses with an IllegalArgumentException saying {@code words}. */
  private static void refused(String words, String... pairs) {
    IllegalArgumentException error =
        assertThrows(IllegalArgumentException.class, () -> parse(pairs));
    assertTrue(error.getMessage().contains(words), error.getMessage());
  }

  @Test
  void theDefaults() {
    Settings settings = parse();
    assertEquals("s", settings.stream);
    assertEquals(List.of(Settings.DEFAULT_SERVER), settings.servers);
    assertTrue(settings.leaders.isEmpty());
    assertTrue(settings.tasks.isEmpty());
    assertFalse(settings.reverse);
    assertTrue(settings.failOnDataLoss);
    assertFalse(settings.tls);
    assertNull(settings.tlsCa);
    assertNull(settings.token);
  }

  @Test
  void optionNamesInAnyCase() {
    Settings settings =
        Settings.parse(
            Map.of(
                "STREAM", " orders ",
                "Tasks", "0:0:1",
                "failondataloss", "FALSE",
                "REVERSE", " true ",
                "tlsca", "/ca.pem",
                "TOKEN", "t"));
    assertEquals("orders", settings.stream);
    assertEquals(1, settings.tasks.size());
    assertFalse(settings.failOnDataLoss);
    assertTrue(settings.reverse);
    assertEquals("/ca.pem", settings.tlsCa);
    assertTrue(settings.tls);
    assertEquals("t", settings.token);
  }

  @Test
  void aStreamIsRequired() {
    refused("option 'stream' is required", "stream", null);
    refused("option 'stream' is required", "stream", "  ");
  }

  @Test
  void tasksAreRequired() {
    refused("option 'tasks' is required", "tasks", null);
  }

  @Test
  void tasksAndTheirRangesInOrder() {
    Settings settings =
        parse("tasks", "3:10:20, 1:0:5;;0:7:7; ;2:9223372036854775806:9223372036854775807");
    assertEquals(3, settings.tasks.size());
    List<long[]> first = settings.tasks.get(0);
    assertEquals(2, first.size());
    assertArrayEquals(new long[] {3, 10, 20}, first.get(0));
    assertArrayEquals(new long[] {1, 0, 5}, first.get(1));
    assertArrayEquals(new long[] {0, 7, 7}, settings.tasks.get(1).get(0));
    assertArrayEquals(
        new long[] {2, Long.MAX_VALUE - 1, Long.MAX_VALUE}, settings.tasks.get(2).get(0));
    assertTrue(parse("tasks", " ; ").tasks.isEmpty());
    assertEquals(
        Integer.MAX_VALUE, parse("tasks", "2147483647:0:1").tasks.get(0).get(0)[0]);
  }

  @Test
  void badTasks() {
    for (String tasks :
        new String[] {"0:1", "0:1:2:3", "0:1:2:", "0:1:2,,0:3:4", "0;1", "0:1:2,", "0:1:2,;"}) {
      refused("is not partition:start:stop", "tasks", tasks);
    }
    refused("is not partition:start:stop with start <= stop", "tasks", "0:5:3");
    refused("is not partition:start:stop with start <= stop", "tasks", "2147483648:0:1");
    String[] numbers = {"a:0:1", "0::2", "0:-1:3", "0:1:x", "0:1:99999999999999999999"};
    for (String tasks : numbers) {
      refused("is not a number >= 0", "tasks", tasks);
    }
  }

  @Test
  void serversInOrder() {
    Settings settings = parse("servers", " a:1, b:2 ,,[::1]:3");
    assertEquals(List.of("a:1", "b:2", "[::1]:3"), settings.servers);
  }

  @Test
  void badServers() {
    refused("names no server", "servers", " , ");
    for (String servers : new String[] {"nohost", ":1", "h:", "a:1,b"}) {
      refused("is not host:port", "servers", servers);
    }
    refused("is not a number >= 0", "servers", "h:x");
    refused("is not a number >= 0", "servers", "h:-1");
  }

  @Test
  void leadersGoFirstThenEveryOtherServer() {
    Settings settings = parse("servers", "a:1,b:2,c:3", "leaders", "0=b:2, 5 = d:4,");
    assertEquals(Map.of(0, "b:2", 5, "d:4"), settings.leaders);
    assertEquals(List.of("b:2", "a:1", "c:3"), settings.serversFor(0));
    assertEquals(List.of("d:4", "a:1", "b:2", "c:3"), settings.serversFor(5));
    assertEquals(List.of("a:1", "b:2", "c:3"), settings.serversFor(1));
  }

  @Test
  void badLeaders() {
    refused("is not partition=host:port", "leaders", "0");
    refused("is not a number >= 0", "leaders", "x=h:1");
    refused("is not a number >= 0", "leaders", "-1=h:1");
    refused("is not host:port", "leaders", "0=h");
    refused("is not a number >= 0", "leaders", "0=h:p");
    refused("partition 2147483648 is not an int32", "leaders", "2147483648=h:1");
  }

  @Test
  void aTokenOnlyOverTls() {
    refused("option 'token' needs TLS", "token", "secret");
    refused("option 'token' needs TLS", "token", "secret", "tls", "false");
    assertTrue(parse("token", "secret", "tls", "true").tls);
    assertTrue(parse("token", "secret", "tlsCa", "/ca.pem").tls);
    assertTrue(parse("token", "secret", "tlsCert", "/c.pem", "tlsKey", "/k.pem").tls);
  }

  @Test
  void aClientCertificateAndItsKeyGoTogether() {
    refused("options 'tlsCert' and 'tlsKey' go together", "tlsCert", "/c.pem");
    refused("options 'tlsCert' and 'tlsKey' go together", "tlsKey", "/k.pem");
    Settings settings = parse("tlsCert", "/c.pem", "tlsKey", "/k.pem");
    assertTrue(settings.tls);
    assertEquals("/c.pem", settings.tlsCert);
    assertEquals("/k.pem", settings.tlsKey);
  }

  @Test
  void badBooleans() {
    for (String name : new String[] {"reverse", "failOnDataLoss", "tls"}) {
      for (String value : new String[] {"yes", "1", "", "t"}) {
        refused("option '" + name + "' must be true or false, not '" + value + "'", name, value);
      }
    }
  }

  @Test
  void settingsSurviveJavaSerialization() throws IOException, ClassNotFoundException {
    // Spark ships them to every task.
    Settings settings =
        parse("tasks", "0:1:2,3:4:5;6:7:8", "leaders", "3=b:2", "servers", "a:1,b:2",
            "reverse", "true");
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
      out.writeObject(settings);
    }
    Settings copy;
    try (ObjectInputStream in =
        new ObjectInputStream(new ByteArrayInputStream(bytes.toByteArray()))) {
      copy = (Settings) in.readObject();
    }
    assertEquals("s", copy.stream);
    assertTrue(copy.reverse);
    assertEquals(List.of("b:2", "a:1"), copy.serversFor(3));
    assertEquals(2, copy.tasks.size());
    assertArrayEquals(new long[] {3, 4, 5}, copy.tasks.get(0).get(1));
  }
}
