package tidelog.spark;

import io.grpc.CallOptions;
import io.grpc.ChannelCredentials;
import io.grpc.Context;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.TlsChannelCredentials;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.MetadataUtils;
import java.io.ByteArrayInputStream;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A gRPC channel to one tidelog server, for {@code tidelog.v1.Tidelog/SubscribeBatches}:
 * plaintext, TLS (the server's CA, or the system's), mutual TLS and a bearer token as the Python
 * client's {@code ClientTls}. Requests and frames are bytes (see {@link Wire}).
 */
final class Connection implements AutoCloseable {
  /** Larger than any frame a server sends (1 MiB, or 4 times the read budget without values). */
  private static final int MAX_FRAME = 256 << 20;
  private static final int WINDOW = 4 << 20;

  private static final MethodDescriptor.Marshaller<byte[]> BYTES =
      new MethodDescriptor.Marshaller<>() {
        @Override
        public InputStream stream(byte[] value) {
          return new ByteArrayInputStream(value);
        }

        @Override
        public byte[] parse(InputStream stream) {
          try {
            return stream.readAllBytes();
          } catch (IOException error) {
            throw new UncheckedIOException(error);
          }
        }
      };

  static final MethodDescriptor<byte[], byte[]> SUBSCRIBE_BATCHES =
      MethodDescriptor.<byte[], byte[]>newBuilder()
          .setType(MethodDescriptor.MethodType.SERVER_STREAMING)
          .setFullMethodName("tidelog.v1.Tidelog/SubscribeBatches")
          .setRequestMarshaller(BYTES)
          .setResponseMarshaller(BYTES)
          .build();

  static final Metadata.Key<String> NOT_LEADER =
      Metadata.Key.of("tidelog-not-leader", Metadata.ASCII_STRING_MARSHALLER);
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  /** An unused channel lets its TCP connection go after this long (and reconnects on use). */
  private static final long IDLE_SECONDS = 60;
  /** A shared channel no task has used for this long is shut down and forgotten. */
  static final long UNUSED_NANOS = TimeUnit.MINUTES.toNanos(5);
  /** Keepalive pings on a call that has received nothing for this long; a broker that does not
   * answer one within {@link #PING_TIMEOUT_SECONDS} (a host gone without closing its
   * connections) fails the call UNAVAILABLE, and the read moves on ({@link RangeRead}). */
  private static final long PING_SECONDS = 30;
  private static final long PING_TIMEOUT_SECONDS = 20;

  private static final Map<String, Connection> SHARED = new HashMap<>();

  final String address;
  private final ManagedChannel channel;
  /** Tasks holding this shared channel, and when the last let go ({@link #shared}). */
  private int users;
  private long unusedSince = System.nanoTime();

  /**
   * The channel of this JVM to {@code address} with these credentials, shared by the tasks that
   * read from it (gRPC channels are made to be shared: each task's subscriptions are calls of
   * their own on it), held until {@link #release}. A task saves a connection's set-up. The
   * credentials are told apart by their files' contents as of now (a certificate renewed in
   * place gets a new channel) and by the token; a channel no task has used for {@link
   * #UNUSED_NANOS} is shut down, so old credentials' channels do not pile up.
   */
  static Connection shared(String address, Settings settings) {
    String key =
        String.join(
            "\u0000",
            address,
            String.valueOf(settings.tls),
            stamp(settings.tlsCa),
            stamp(settings.tlsCert),
            stamp(settings.tlsKey),
            String.valueOf(settings.token));
    synchronized (SHARED) {
      long now = System.nanoTime();
      for (Iterator<Connection> each = SHARED.values().iterator(); each.hasNext(); ) {
        Connection old = each.next();
        if (old.users == 0 && now - old.unusedSince > UNUSED_NANOS) {
          each.remove();
          old.channel.shutdown(); // no call is on it: nothing to wait for
        }
      }
      Connection connection = SHARED.computeIfAbsent(key, k -> new Connection(address, settings));
      connection.users++;
      return connection;
    }
  }

  /** A task is done with a channel of {@link #shared}. */
  void release() {
    synchronized (SHARED) {
      if (--users == 0) {
        unusedSince = System.nanoTime();
      }
    }
  }

  /** A file named in the options, told apart by path and contents (size and modification). */
  private static String stamp(String path) {
    if (path == null) {
      return "-";
    }
    File file = new File(path);
    return path + "@" + file.length() + ":" + file.lastModified();
  }

  Connection(String address, Settings settings) {
    this.address = address;
    NettyChannelBuilder builder =
        NettyChannelBuilder.forTarget(address, credentials(settings))
            .maxInboundMessageSize(MAX_FRAME)
            .initialFlowControlWindow(WINDOW)
            .idleTimeout(IDLE_SECONDS, TimeUnit.SECONDS)
            .keepAliveTime(PING_SECONDS, TimeUnit.SECONDS)
            .keepAliveTimeout(PING_TIMEOUT_SECONDS, TimeUnit.SECONDS)
            .userAgent("tidelog-spark-jvm");
    if (settings.token != null) {
      Metadata headers = new Metadata();
      headers.put(AUTHORIZATION, "Bearer " + settings.token);
      builder.intercept(MetadataUtils.newAttachHeadersInterceptor(headers));
    }
    channel = builder.build();
  }

  private static ChannelCredentials credentials(Settings settings) {
    if (!settings.tls) {
      return InsecureChannelCredentials.create();
    }
    TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder();
    try {
      if (settings.tlsCa != null) {
        tls.trustManager(new File(settings.tlsCa));
      }
      if (settings.tlsCert != null) {
        // netty reads only PKCS#8 keys: PemKeys converts OpenSSL's other unencrypted forms.
        tls.keyManager(
            new ByteArrayInputStream(Files.readAllBytes(Path.of(settings.tlsCert))),
            new ByteArrayInputStream(PemKeys.pkcs8(Path.of(settings.tlsKey))));
      }
    } catch (IOException | UncheckedIOException error) {
      throw new IllegalArgumentException(
          "cannot read the TLS files of options 'tlsCa', 'tlsCert', 'tlsKey': " + error, error);
    }
    return tls.build();
  }

  /**
   * The frames of one subscription, received as the iterator is consumed; {@code scope} ends
   * the subscription when cancelled. Errors come out of {@code hasNext}/{@code next} as gRPC's
   * {@code StatusRuntimeException}.
   */
  Iterator<byte[]> subscribe(byte[] request, Context.CancellableContext scope) {
    Context previous = scope.attach();
    try {
      return ClientCalls.blockingServerStreamingCall(
          channel, SUBSCRIBE_BATCHES, CallOptions.DEFAULT, request);
    } finally {
      scope.detach(previous);
    }
  }

  /** Whether a failed call may succeed on another server or later: the server is out of reach,
   * or not the partition's leader (any more). */
  static boolean elsewhere(Status status, Metadata trailers) {
    return status.getCode() == Status.Code.UNAVAILABLE
        || (trailers != null && trailers.containsKey(NOT_LEADER));
  }

  @Override
  public void close() {
    channel.shutdownNow();
    try {
      channel.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException error) {
      Thread.currentThread().interrupt();
    }
  }
}
