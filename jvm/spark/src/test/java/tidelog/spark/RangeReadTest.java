package tidelog.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * {@link RangeRead} against scripted servers ({@link FakeTidelog}) over real gRPC on 127.0.0.1:
 * the requests it sends, the frames it returns, how it tells a loss from a gap, and where it goes
 * when a server fails or refuses.
 */
class RangeReadTest {
  private final List<FakeTidelog> servers = new ArrayList<>();
  private final Map<String, Connection> held = new HashMap<>();
  private final List<RangeRead> reads = new ArrayList<>();

  @AfterEach
  void tearDown() {
    RangeRead.retryMs = RangeRead.RETRY_MS;
    reads.forEach(RangeRead::close);
    held.values().forEach(Connection::release);
    servers.forEach(FakeTidelog::close);
  }

  private FakeTidelog server(FakeTidelog.Script script) {
    FakeTidelog server = new FakeTidelog().script(script);
    servers.add(server);
    return server;
  }

  /** Settings reading stream 's' from {@code addresses}, then alternating option names and
   * values. */
  private static Settings settings(List<String> addresses, String... pairs) {
    Map<String, String> options = new HashMap<>();
    options.put("stream", "s");
    options.put("tasks", ";");
    options.put("servers", String.join(",", addresses));
    for (int i = 0; i < pairs.length; i += 2) {
      options.put(pairs[i], pairs[i + 1]);
    }
    return Settings.parse(options);
  }

  private RangeRead read(
      Settings settings, long start, long stop, boolean omitValues, boolean omitTimestamps) {
    RangeRead read =
        new RangeRead(
            settings, new long[] {0, start, stop}, omitValues, omitTimestamps,
            address -> held.computeIfAbsent(address, a -> Connection.shared(a, settings)));
    reads.add(read);
    return read;
  }

  private RangeRead read(Settings settings, long start, long stop) {
    return read(settings, start, stop, false, false);
  }

  /** Every offset the read returns, frame by frame, until it returns null. */
  private static List<Long> drain(RangeRead read) {
    List<Long> offsets = new ArrayList<>();
    for (Frame frame = read.next(); frame != null; frame = read.next()) {
      for (int i = 0; i < frame.count; i++) {
        offsets.add(frame.offset(i));
      }
    }
    assertNull(read.next(), "a finished read stays finished");
    return offsets;
  }

  private static List<Long> offsets(long from, long to) {
    List<Long> offsets = new ArrayList<>();
    for (long offset = from; from <= to ? offset <= to : offset >= to;
        offset += from <= to ? 1 : -1) {
      offsets.add(offset);
    }
    return offsets;
  }

  /** Answers a range read from {@code first} with frames of 5 records up to {@code last}, then
   * the end; answers the oldest probe with {@code oldest} (null: an empty partition). */
  private static FakeTidelog.Script retained(long first, long last, Long oldest) {
    return (request, reply) -> {
      if (request.oldestProbe()) {
        if (oldest != null) {
          reply.frame(oldest);
        }
        reply.end(2);
        return;
      }
      long from = Math.max(first, request.startOffset());
      for (long at = from; at <= Math.min(last, request.stopOffset()); at += 5) {
        reply.range(at, Math.min(at + 4, Math.min(last, request.stopOffset())));
      }
      reply.end(1);
    };
  }

  @Test
  void forwardReadReturnsEveryFrameThenNull() {
    FakeTidelog a = server(retained(0, 9, 0L));
    RangeRead read = read(settings(List.of(a.address())), 0, 10);
    Frame first = read.next();
    assertEquals(5, first.count);
    assertEquals(0, first.firstOffset());
    assertEquals(4, first.lastOffset());
    assertEquals(List.of(5L, 6L, 7L, 8L, 9L), drain(read));
    assertEquals(1, a.seen().size(), "no oldest probe when the first frame starts at start");
    FakeTidelog.Request request = a.seen().get(0);
    assertEquals("s", request.stream());
    assertEquals(0, request.partition());
    assertEquals(Wire.START_OFFSET, request.startPosition());
    assertEquals(0, request.startOffset());
    assertEquals(Wire.STOP_OFFSET, request.stopPosition());
    assertEquals(9, request.stopOffset());
    assertFalse(request.reverse());
    assertEquals(0, request.maxMessages(), "with values the server sizes the frames");
    assertFalse(request.withoutValues());
    assertFalse(request.withoutValueSizes());
    assertFalse(request.withoutTimestamps());
  }

  @Test
  void omittedColumnsAreAskedFor() {
    FakeTidelog a = server(retained(0, 9, 0L));
    Settings settings = settings(List.of(a.address()));
    assertEquals(offsets(0, 9), drain(read(settings, 0, 10, true, true)));
    assertEquals(offsets(0, 9), drain(read(settings, 0, 10, false, true)));
    assertEquals(offsets(0, 9), drain(read(settings, 0, 10, true, false)));
    List<FakeTidelog.Request> seen = a.seen();
    assertEquals(3, seen.size());
    assertTrue(seen.get(0).withoutValues() && seen.get(0).withoutValueSizes());
    assertTrue(seen.get(0).withoutTimestamps());
    assertEquals(Settings.FRAME_MESSAGES, seen.get(0).maxMessages());
    assertFalse(seen.get(1).withoutValues() || seen.get(1).withoutValueSizes());
    assertTrue(seen.get(1).withoutTimestamps());
    assertTrue(seen.get(2).withoutValues() && seen.get(2).withoutValueSizes());
    assertFalse(seen.get(2).withoutTimestamps());
  }

  @Test
  void firstFrameAboveStartWithOldestThereIsALoss() {
    FakeTidelog a = server(retained(3, 9, 3L));
    RangeRead read = read(settings(List.of(a.address())), 0, 10);
    RangeRead.OffsetsLost lost = assertThrows(RangeRead.OffsetsLost.class, read::next);
    assertTrue(
        lost.getMessage().startsWith("offsets 0..2 of 's' partition 0 were removed by retention"),
        lost.getMessage());
    assertTrue(lost.getMessage().contains("failOnDataLoss=false"), lost.getMessage());
    assertEquals(1, a.probes().size());
    FakeTidelog.Request probe = a.probes().get(0);
    assertTrue(probe.reverse());
    assertEquals(1, probe.maxMessages());
    assertEquals("s", probe.stream());
  }

  @Test
  void lossIsSkippedWithoutFailOnDataLoss() {
    FakeTidelog a = server(retained(3, 9, 3L));
    RangeRead read = read(settings(List.of(a.address()), "failOnDataLoss", "false"), 0, 10);
    assertEquals(offsets(3, 9), drain(read));
    assertEquals(1, a.probes().size());
  }

  @Test
  void firstFrameAboveStartWithOlderRecordsIsAGap() {
    FakeTidelog a = server(retained(3, 9, 0L));
    assertEquals(offsets(3, 9), drain(read(settings(List.of(a.address())), 0, 10)));
    assertEquals(1, a.probes().size());
  }

  @Test
  void oldestProbeThatNeverAnswersFailsTheRead() {
    RangeRead.retryMs = 1_000;
    FakeTidelog a =
        server(
            (request, reply) -> {
              if (request.oldestProbe()) {
                reply.fail(Status.UNAVAILABLE.withDescription("going away"));
                return;
              }
              reply.range(3, 9);
              reply.end(1);
            });
    RangeRead read = read(settings(List.of(a.address())), 0, 10);
    long began = System.nanoTime();
    IllegalStateException error = assertThrows(IllegalStateException.class, read::next);
    long tookMs = (System.nanoTime() - began) / 1_000_000;
    assertFalse(error instanceof RangeRead.OffsetsLost, "no answer is not a verdict");
    assertTrue(error.getMessage().contains("oldest offset"), error.getMessage());
    assertTrue(error.getMessage().contains("UNAVAILABLE"), error.getMessage());
    assertTrue(a.probes().size() >= 2, "asked again within the budget: " + a.probes().size());
    assertTrue(tookMs >= 1_000 && tookMs < 10_000, "took " + tookMs + " ms");
  }

  @Test
  void unavailableServerIsLeftForTheNextResumingAfterTheLastRecord() {
    FakeTidelog a =
        server(
            (request, reply) -> {
              reply.range(0, 4);
              reply.fail(Status.UNAVAILABLE.withDescription("shutting down"));
            });
    FakeTidelog b = server(retained(0, 9, 0L));
    RangeRead read = read(settings(List.of(a.address(), b.address())), 0, 10);
    assertEquals(offsets(0, 9), drain(read), "every record once");
    assertEquals(1, a.seen().size());
    assertEquals(1, b.seen().size());
    assertEquals(5, b.seen().get(0).startOffset());
    assertEquals(9, b.seen().get(0).stopOffset());
  }

  @Test
  void aSubscriptionCutShortWithoutItsEndReasonIsReadOnElsewhere() {
    FakeTidelog a =
        server(
            (request, reply) -> {
              reply.range(0, 4);
              reply.complete(); // ends cleanly, without the frame that says why
            });
    FakeTidelog b = server(retained(0, 9, 0L));
    RangeRead read = read(settings(List.of(a.address(), b.address())), 0, 10);
    assertEquals(offsets(0, 9), drain(read), "every record once, none left out");
    assertEquals(5, b.seen().get(0).startOffset());
  }

  @Test
  void anEndReasonOnTheLastFrameOfRecordsEndsTheRange() {
    FakeTidelog a =
        server(
            (request, reply) -> {
              reply.range(0, 4);
              reply.range(5, 7); // the range's tail was compacted away: the server says so
              reply.end(1);
            });
    RangeRead read = read(settings(List.of(a.address())), 0, 10);
    assertEquals(offsets(0, 7), drain(read));
    assertEquals(1, a.seen().size());
  }

  @Test
  void notLeaderRefusalSendsTheReadToTheLeaderNamed() {
    FakeTidelog b = server(retained(0, 9, 0L));
    FakeTidelog a = server((request, reply) -> reply.notLeader(b.address()));
    RangeRead read = read(settings(List.of(a.address())), 0, 10);
    long began = System.nanoTime();
    assertEquals(offsets(0, 9), drain(read));
    assertTrue((System.nanoTime() - began) / 1_000_000 < 5_000, "at once, without a pause");
    assertEquals(1, a.seen().size());
    assertEquals(1, b.seen().size());
    assertEquals(0, b.seen().get(0).startOffset());
  }

  @Test
  void oldestProbeRefusedByAFollowerGoesToTheLeaderNamed() {
    RangeRead.retryMs = 2_000;
    FakeTidelog b = server(retained(3, 9, 0L));
    FakeTidelog a =
        server(
            (request, reply) -> {
              if (request.oldestProbe()) {
                reply.notLeader(b.address()); // leadership moved after the read began
              } else {
                reply.range(3, 9);
                reply.end(1);
              }
            });
    RangeRead read = read(settings(List.of(a.address())), 0, 10);
    assertEquals(offsets(3, 9), drain(read), "a gap on the leader named: no loss");
    assertEquals(1, a.probes().size());
    assertEquals(1, b.probes().size());
    assertEquals(0, b.reads().size());
  }

  @Test
  void reverseReadIsNewestFirstAndChecksTheLowestDelivered() {
    FakeTidelog whole =
        server(
            (request, reply) -> {
              reply.range(9, 5).range(4, 0);
              reply.end(2);
            });
    Settings reverse = settings(List.of(whole.address()), "reverse", "true");
    assertEquals(offsets(9, 0), drain(read(reverse, 0, 10)));
    assertEquals(1, whole.seen().size(), "nothing below start: no probe");
    FakeTidelog.Request request = whole.seen().get(0);
    assertTrue(request.reverse());
    assertEquals(9, request.startOffset());
    assertEquals(0, request.stopOffset());
    assertEquals(Wire.STOP_OFFSET, request.stopPosition());

    FakeTidelog trimmed =
        server(
            (asked, reply) -> {
              if (asked.oldestProbe()) {
                reply.frame(3);
              } else {
                reply.range(9, 5).range(4, 3);
              }
              reply.end(2);
            });
    Settings lossy = settings(List.of(trimmed.address()), "reverse", "true");
    RangeRead read = read(lossy, 0, 10);
    Frame newest = read.next();
    assertEquals(9, newest.firstOffset());
    assertEquals(5, newest.lastOffset());
    Frame lowest = read.next();
    assertEquals(4, lowest.firstOffset());
    assertEquals(3, lowest.lastOffset());
    RangeRead.OffsetsLost lost = assertThrows(RangeRead.OffsetsLost.class, read::next);
    assertTrue(lost.getMessage().startsWith("offsets 0..2 of 's' partition 0"), lost.getMessage());
  }

  @Test
  void rangeRefusedBelowTheOldestIsLostWhole() {
    FakeTidelog a =
        server(
            (request, reply) -> {
              if (request.oldestProbe()) {
                reply.frame(20);
                reply.end(2);
              } else {
                reply.fail(Status.INVALID_ARGUMENT.withDescription("offset 0 is below 20"));
              }
            });
    RangeRead read = read(settings(List.of(a.address())), 0, 10);
    RangeRead.OffsetsLost lost = assertThrows(RangeRead.OffsetsLost.class, read::next);
    assertTrue(
        lost.getMessage().startsWith("offsets 0..9 of 's' partition 0 were removed by retention"),
        lost.getMessage());
    assertEquals(1, a.reads().size());
    assertEquals(1, a.probes().size());
  }

  @Test
  void otherStatusFailsTheReadAtOnce() {
    FakeTidelog a =
        server((request, reply) -> reply.fail(Status.PERMISSION_DENIED.withDescription("no")));
    FakeTidelog b = server(retained(0, 9, 0L));
    RangeRead read = read(settings(List.of(a.address(), b.address())), 0, 10);
    IllegalStateException error = assertThrows(IllegalStateException.class, read::next);
    assertTrue(error.getMessage().contains("PERMISSION_DENIED"), error.getMessage());
    assertTrue(error.getMessage().contains("partition 0"), error.getMessage());
    assertTrue(error.getMessage().contains(a.address()), error.getMessage());
    assertEquals(0, b.seen().size(), "not tried elsewhere");
  }
}
