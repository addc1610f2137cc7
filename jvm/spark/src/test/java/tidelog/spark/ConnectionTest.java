package tidelog.spark;

import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@link Connection#shared}: one channel per address and credentials in a JVM, told apart by the
 * token and by the TLS files' contents. Channels are made, never connected (gRPC connects on the
 * first call), so no server is needed; each test uses an address of its own, as the cache is the
 * JVM's.
 */
class ConnectionTest {
  private final List<Connection> held = new ArrayList<>();
  @TempDir Path dir;

  @AfterEach
  void releaseAll() {
    held.forEach(Connection::release);
  }

  private Connection shared(String address, Settings settings) {
    Connection connection = Connection.shared(address, settings);
    held.add(connection);
    return connection;
  }

  private static Settings settings(String... pairs) {
    Map<String, String> options = new HashMap<>();
    options.put("stream", "s");
    options.put("tasks", ";");
    for (int i = 0; i < pairs.length; i += 2) {
      options.put(pairs[i], pairs[i + 1]);
    }
    return Settings.parse(options);
  }

  /** A self-signed CA certificate for the tests (test-ca.pem beside this class). */
  private static byte[] caPem() throws IOException {
    try (InputStream in = ConnectionTest.class.getResourceAsStream("test-ca.pem")) {
      return in.readAllBytes();
    }
  }

  @Test
  void sameAddressAndSettingsShareOneChannel() {
    Settings settings = settings();
    Connection first = shared("127.0.0.1:1", settings);
    assertSame(first, shared("127.0.0.1:1", settings));
    assertSame(first, shared("127.0.0.1:1", settings()), "equal options, another Settings");
    assertNotSame(first, shared("127.0.0.1:2", settings));
  }

  @Test
  void anotherTokenGetsAnotherChannel() throws IOException {
    Path ca = dir.resolve("ca.pem");
    Files.write(ca, caPem());
    String path = ca.toString();
    Connection a = shared("127.0.0.1:3", settings("tlsCa", path, "token", "a"));
    assertSame(a, shared("127.0.0.1:3", settings("tlsCa", path, "token", "a")));
    assertNotSame(a, shared("127.0.0.1:3", settings("tlsCa", path, "token", "b")));
    assertNotSame(a, shared("127.0.0.1:3", settings("tlsCa", path)));
  }

  @Test
  void caFileRewrittenGetsAnotherChannel() throws IOException {
    Path ca = dir.resolve("ca.pem");
    byte[] pem = caPem();
    Files.write(ca, pem);
    Settings settings = settings("tlsCa", ca.toString());
    Connection before = shared("127.0.0.1:4", settings);
    assertSame(before, shared("127.0.0.1:4", settings));
    // A bundle of the certificate twice: another size, still a valid CA file.
    byte[] twice = new byte[2 * pem.length];
    System.arraycopy(pem, 0, twice, 0, pem.length);
    System.arraycopy(pem, 0, twice, pem.length, pem.length);
    Files.write(ca, twice);
    Connection after = shared("127.0.0.1:4", settings);
    assertNotSame(before, after);
    assertSame(after, shared("127.0.0.1:4", settings));
  }

  @Test
  void releasedChannelIsReusedUntilUnusedLongEnough() {
    Settings settings = settings();
    Connection first = Connection.shared("127.0.0.1:5", settings);
    first.release();
    Connection again = shared("127.0.0.1:5", settings);
    assertSame(first, again, "released moments ago: kept for the next task");
  }
}
