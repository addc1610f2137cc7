package tidelog.spark;

import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import java.util.function.Function;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The committed records of one partition's offsets {@code [start, stop)}, frame after frame,
 * oldest first (newest first with {@code reverse}), as the Python source's
 * {@code remote.read_range}: offsets below the oldest retained one are lost to retention (an
 * error with {@code failOnDataLoss}, else a warning and the rest of the range); gaps left by
 * compaction are not losses. A server out of reach, or no longer the partition's leader, is left
 * for the next one of {@link Settings#serversFor}, resuming after the last record delivered, for
 * up to {@link #RETRY_MS} in all. A broker that is not the leader names the leader it knows in
 * its refusal ("(the leader is HOST:PORT)", the Liftbridge text): that one is tried next, at
 * once, even when the options named only other brokers (a plan made before a failover, or a
 * follower alone in {@code servers}).
 */
final class RangeRead implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(RangeRead.class);
  static final long RETRY_MS = 30_000;
  /** The retry budget in force: {@link #RETRY_MS}; package-private and mutable only so unit
   * tests (RangeReadTest) can run out of it in a second. Nothing else sets it. */
  static volatile long retryMs = RETRY_MS;
  private static final long PAUSE_MS = 250;
  private static final Pattern LEADER_IS = Pattern.compile("\\(the leader is ([^\\s)]+)\\)");

  final int partition;
  private final long start;
  private final long stop;
  private final Settings settings;
  private final boolean omitValues;
  private final boolean omitTimestamps;
  private final Function<String, Connection> connections;
  private final List<String> servers;
  private int server;
  /** The leaders refusals named and this read moved to, since the last frame delivered. */
  private final Set<String> hinted = new HashSet<>();
  private long retryUntil;

  /** The next offset to read: forward the lowest not yet delivered, reverse the highest. */
  private long next;
  private boolean delivered;
  private Context.CancellableContext scope;
  private Iterator<byte[]> frames;
  /** The current subscription sent its end reason. */
  private boolean ended;
  private boolean done;

  RangeRead(
      Settings settings,
      long[] range,
      boolean omitValues,
      boolean omitTimestamps,
      Function<String, Connection> connections) {
    this.settings = settings;
    this.partition = (int) range[0];
    this.start = range[1];
    this.stop = range[2];
    this.omitValues = omitValues;
    this.omitTimestamps = omitTimestamps;
    this.connections = connections;
    this.servers = new ArrayList<>(settings.serversFor(partition));
    this.next = settings.reverse ? stop - 1 : start;
    this.done = stop <= start;
  }

  /** The next frame with records; null once the range is read. */
  Frame next() {
    while (!done) {
      try {
        if (frames == null) {
          open();
        }
        if (!frames.hasNext()) {
          if (!ended) {
            // A bounded subscription ends with a frame that says why (EndReason); one that
            // stops without it was cut short (a broker going away cleanly): read on elsewhere.
            throw Status.UNAVAILABLE
                .withDescription("the subscription ended before its stop, without an end reason")
                .asRuntimeException();
          }
          finish();
          continue;
        }
        Frame frame = Frame.parse(frames.next());
        ended |= frame.end != 0;
        if (frame.count == 0) {
          if (frame.end != 0) {
            finish();
          }
          continue;
        }
        take(frame);
        return frame;
      } catch (StatusRuntimeException error) {
        fail(error);
      }
    }
    return null;
  }

  private void open() {
    long first = next;
    long last = settings.reverse ? start : stop - 1;
    byte[] request =
        Wire.subscribeRange(
            settings.stream, partition, first, last, settings.reverse,
            // With values: the broker's own frame size (whole 1 MiB read-ahead spans while
            // catching up, four times fewer frames than its 256 KiB budget); without: as many
            // records as fit the larger frames a read without values may send.
            omitValues ? Settings.FRAME_MESSAGES : 0,
            omitValues, omitTimestamps);
    scope = Context.current().withCancellation();
    ended = false;
    frames = connections.apply(servers.get(server)).subscribe(request, scope);
  }

  private void take(Frame frame) {
    if (!settings.reverse && !delivered && frame.firstOffset() > start) {
      checkLoss(start);
    }
    delivered = true;
    hinted.clear();
    next = settings.reverse ? frame.lastOffset() - 1 : frame.lastOffset() + 1;
    retryUntil = 0;
    if (settings.reverse ? next < start : next >= stop) {
      finish();
    }
  }

  private void finish() {
    end();
    if (settings.reverse ? next >= start : !delivered) {
      checkLoss(start); // fails the task itself if it cannot tell (oldest())
    }
    done = true;
  }

  private void fail(StatusRuntimeException error) {
    end();
    Status status = error.getStatus();
    if (!delivered && status.getCode() == Status.Code.INVALID_ARGUMENT) {
      // The server refuses a range wholly below the retained start.
      Long oldest = oldest();
      if (oldest != null && oldest > start) {
        done = true;
        lost(Math.min(oldest, stop));
        return;
      }
    }
    if (!Connection.elsewhere(status, error.getTrailers())) {
      throw new IllegalStateException(
          "reading offsets " + start + ".." + (stop - 1) + " of '" + settings.stream
              + "' partition " + partition + " from " + servers.get(server) + ": "
              + status.getCode() + " " + status.getDescription(),
          error);
    }
    long now = System.currentTimeMillis();
    if (retryUntil == 0) {
      retryUntil = now + retryMs;
    } else if (now > retryUntil) {
      throw new IllegalStateException(
          "no server of " + servers + " served '" + settings.stream + "' partition " + partition
              + " for " + retryMs / 1000 + " s: " + status.getCode() + " "
              + status.getDescription(),
          error);
    }
    LOG.warn(
        "reading '{}' partition {} from {}: {} {}; trying another server",
        settings.stream, partition, servers.get(server), status.getCode(),
        status.getDescription());
    server = nextServer(server, status, hinted);
  }

  /**
   * Which of {@link #servers} to ask after {@code servers[at]} failed with {@code status}: the
   * leader a not-leader refusal names, at once and once per leader ({@code followed}), even one
   * the options do not name (it joins the list); else the next one, with a pause after each
   * round, so brokers that name each other wait as any other failure.
   */
  private int nextServer(int at, Status status, Set<String> followed) {
    String leader = leaderNamed(status);
    if (leader != null && !leader.equals(servers.get(at)) && followed.add(leader)) {
      if (!servers.contains(leader)) {
        servers.add(leader);
      }
      return servers.indexOf(leader);
    }
    int next = (at + 1) % servers.size();
    pauseAfterRound(next);
    return next;
  }

  /** The leader's address a not-leader refusal names; null when it names none. */
  private static String leaderNamed(Status status) {
    if (status.getCode() != Status.Code.FAILED_PRECONDITION || status.getDescription() == null) {
      return null;
    }
    Matcher named = LEADER_IS.matcher(status.getDescription());
    return named.find() ? named.group(1) : null;
  }

  /** Whether offsets from {@code from} were removed by retention: an error or a warning. */
  private void checkLoss(long from) {
    Long oldest = oldest();
    if (oldest != null && oldest <= from) {
      return; // a gap (compaction), not a loss
    }
    lost(oldest == null ? stop : Math.min(oldest, stop));
  }

  private void lost(long lostTo) {
    String message =
        "offsets " + start + ".." + (lostTo - 1) + " of '" + settings.stream + "' partition "
            + partition + " were removed by retention before this query read them";
    if (settings.failOnDataLoss) {
      throw new OffsetsLost(
          message + "; set option failOnDataLoss=false to skip them with a warning");
    }
    LOG.warn("{}; skipped (failOnDataLoss=false)", message);
  }

  /**
   * The partition's oldest retained offset; null when it holds no record. Asked of the servers
   * in turn as reads are ({@link #fail}: the leader a refusal names first) for up to {@link
   * #RETRY_MS}; a loss is never passed over because the question could not be asked: any other
   * failure, or none answering, fails the task.
   */
  private Long oldest() {
    long until = System.currentTimeMillis() + retryMs;
    int at = server;
    Set<String> followed = new HashSet<>();
    while (true) {
      Context.CancellableContext probe = Context.current().withCancellation();
      try {
        Iterator<byte[]> first =
            connections
                .apply(servers.get(at))
                .subscribe(Wire.subscribeOldest(settings.stream, partition), probe);
        while (first.hasNext()) {
          Frame frame = Frame.parse(first.next());
          if (frame.count > 0) {
            return frame.firstOffset();
          }
          if (frame.end != 0) {
            break;
          }
        }
        return null;
      } catch (StatusRuntimeException error) {
        Status status = error.getStatus();
        String why =
            "asking " + servers.get(at) + " for the oldest offset of '" + settings.stream
                + "' partition " + partition + " (to tell a loss from a gap): "
                + status.getCode() + " " + status.getDescription();
        if (!Connection.elsewhere(status, error.getTrailers())
            || System.currentTimeMillis() > until) {
          throw new IllegalStateException(why, error);
        }
        LOG.warn("{}; trying another server", why);
        at = nextServer(at, status, followed);
      } finally {
        probe.cancel(null);
      }
    }
  }

  private static void pauseAfterRound(int next) {
    if (next == 0) {
      try {
        Thread.sleep(PAUSE_MS);
      } catch (InterruptedException interrupted) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException("interrupted", interrupted);
      }
    }
  }

  private void end() {
    if (scope != null) {
      scope.cancel(null);
      scope = null;
    }
    frames = null;
  }

  @Override
  public void close() {
    end();
  }

  /** Offsets the query was to read were removed by retention first. */
  static final class OffsetsLost extends IllegalStateException {
    private static final long serialVersionUID = 1L;

    OffsetsLost(String message) {
      super(message);
    }
  }
}
