package tidelog.spark;

import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerServiceDefinition;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.ServerCalls;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A scripted stand-in for a tidelog server in the tests: {@code SubscribeBatches} on 127.0.0.1
 * (port 0: one the system picks), with the reader's own method descriptor and byte marshallers
 * ({@link Connection#SUBSCRIBE_BATCHES}). Each call's request is parsed ({@link Request}),
 * recorded, and answered by the test's {@link Script}: frames of given offsets (shaped as the
 * request asked: without values, value sizes or timestamps), an end frame, an error status with
 * trailers. A call the script leaves open is completed when the script returns.
 */
final class FakeTidelog implements AutoCloseable {
  /** The fields of a {@code SubscribeBatchesRequest} (absent = 0 / false, as protobuf). */
  record Request(
      String stream,
      int partition,
      int startPosition,
      long startOffset,
      int stopPosition,
      long stopOffset,
      boolean reverse,
      int maxMessages,
      boolean withoutValues,
      boolean withoutValueSizes,
      boolean withoutTimestamps) {

    /** The reader's question for the oldest retained offset ({@link Wire#subscribeOldest}). */
    boolean oldestProbe() {
      return startPosition == Wire.START_EARLIEST;
    }

    static Request parse(byte[] buf) {
      String stream = "";
      long[] varints = new long[16];
      Wire.Reader field = new Wire.Reader(buf, 0, buf.length);
      while (field.next()) {
        if (field.field == 1 && field.type == Wire.LEN) {
          stream = new String(buf, field.start, field.length, StandardCharsets.UTF_8);
        } else if (field.type == Wire.VARINT && field.field < varints.length) {
          varints[field.field] = field.value;
        }
      }
      return new Request(
          stream, (int) varints[2], (int) varints[3], varints[4], (int) varints[6], varints[7],
          varints[9] != 0, (int) varints[11], varints[13] != 0, varints[14] != 0,
          varints[15] != 0);
    }
  }

  /** How a test answers one call. */
  interface Script {
    void answer(Request request, Reply reply);
  }

  /** The answer to one call, sent as it is written. */
  static final class Reply {
    private final Request request;
    private final StreamObserver<byte[]> out;
    private boolean closed;

    Reply(Request request, StreamObserver<byte[]> out) {
      this.request = request;
      this.out = out;
    }

    /** A frame of records at {@code offsets} (value "v" + offset, timestamp = offset). */
    Reply frame(long... offsets) {
      Proto messages = new Proto();
      int[] sizes = new int[offsets.length];
      StringBuilder values = new StringBuilder();
      for (int i = 0; i < offsets.length; i++) {
        String value = "v" + offsets[i];
        sizes[i] = value.length();
        values.append(value);
      }
      if (request.withoutValues()) {
        messages.varint(7, 1);
        if (request.withoutValueSizes()) {
          messages.varint(8, 1);
        } else {
          messages.bytes(2, Proto.ints(sizes));
        }
      } else {
        messages.string(1, values.toString()).bytes(2, Proto.ints(sizes));
      }
      Proto batch = new Proto().bytes(1, Proto.longs(offsets));
      if (request.withoutTimestamps()) {
        batch.varint(5, 1);
      } else {
        batch.bytes(2, Proto.longs(offsets));
      }
      out.onNext(batch.message(3, messages).toByteArray());
      return this;
    }

    /** Records {@code from..to} inclusive in one frame, in that order (descending if from > to). */
    Reply range(long from, long to) {
      long[] offsets = new long[(int) Math.abs(to - from) + 1];
      for (int i = 0; i < offsets.length; i++) {
        offsets[i] = from <= to ? from + i : from - i;
      }
      return frame(offsets);
    }

    /** The last frame, empty, with an {@code EndReason}; the call ends. */
    void end(int reason) {
      out.onNext(new Proto().varint(4, reason).toByteArray());
      complete();
    }

    void complete() {
      if (!closed) {
        closed = true;
        out.onCompleted();
      }
    }

    void fail(Status status, Metadata trailers) {
      closed = true;
      out.onError(status.asRuntimeException(trailers));
    }

    void fail(Status status) {
      fail(status, new Metadata());
    }

    /** A follower's refusal naming the leader it knows. */
    void notLeader(String leader) {
      Metadata trailers = new Metadata();
      trailers.put(Connection.NOT_LEADER, "1");
      fail(
          Status.FAILED_PRECONDITION.withDescription(
              "this server is not the leader of partition " + request.partition()
                  + " (the leader is " + leader + ")"),
          trailers);
    }
  }

  private final Server server;
  private final List<Request> seen = new ArrayList<>();
  private volatile Script script = (request, reply) -> reply.fail(Status.UNIMPLEMENTED);

  FakeTidelog() {
    ServerServiceDefinition service =
        ServerServiceDefinition.builder("tidelog.v1.Tidelog")
            .addMethod(
                Connection.SUBSCRIBE_BATCHES,
                ServerCalls.asyncServerStreamingCall(
                    (byte[] bytes, StreamObserver<byte[]> out) -> {
                      Request request = Request.parse(bytes);
                      synchronized (seen) {
                        seen.add(request);
                      }
                      Reply reply = new Reply(request, out);
                      try {
                        script.answer(request, reply);
                      } catch (RuntimeException error) {
                        reply.fail(Status.INTERNAL.withDescription("script: " + error));
                        return;
                      }
                      reply.complete();
                    }))
            .build();
    try {
      server =
          NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0))
              .addService(service)
              .build()
              .start();
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
  }

  FakeTidelog script(Script answers) {
    this.script = answers;
    return this;
  }

  String address() {
    return "127.0.0.1:" + server.getPort();
  }

  /** The requests received so far, in order. */
  List<Request> seen() {
    synchronized (seen) {
      return new ArrayList<>(seen);
    }
  }

  /** The requests for ranges (not the oldest-offset probes) received so far. */
  List<Request> reads() {
    return seen().stream().filter(request -> !request.oldestProbe()).toList();
  }

  /** The oldest-offset probes received so far. */
  List<Request> probes() {
    return seen().stream().filter(Request::oldestProbe).toList();
  }

  @Override
  public void close() {
    server.shutdownNow();
    try {
      server.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException error) {
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public String toString() {
    return "FakeTidelog " + address() + " seen " + Arrays.toString(seen().toArray());
  }
}
