// Command lbbench drives a Liftbridge API server (Liftbridge itself or tidelog's proto.API) with
// Liftbridge's official Go client, go-liftbridge v2, for benchmarks/liftbridge_side.py.
//
// Every mode connects to one server address, does one measured thing on one stream (partition
// 0) and prints exactly one JSON object on its last stdout line; any error goes to stderr with a
// non-zero exit. Every loop is bounded by its count and by -timeout.
//
//	lbbench create  -addr A -stream S
//	    create the stream (subject S.subject), retrying while the server is still starting.
//	lbbench publish -addr A -stream S -count N -size B -ack leader|all -window W
//	    PublishAsync N random payloads of B bytes (all generated before the clock starts), a
//	    permit of W taken before each and given back by its ack handler (go-liftbridge has no
//	    window of its own); every ack checked (no error, offsets 0..N-1 once each when the
//	    stream started empty). Rate = N / (last ack - first send).
//	lbbench catchup -addr A -stream S -count N
//	    Subscribe from the earliest offset and read N messages; every offset checked in
//	    order, every value's length summed. Rate = N / (Subscribe call - N-th message).
//	lbbench live    -addr A -stream S -rate R -seconds D -warmup W -size B [-publish]
//	    Subscribe from new messages only; then, with -publish, PublishAsync R msgs/s (ack
//	    LEADER) on an absolute 1 ms clock for W + D seconds, each payload starting with its
//	    send time (Unix ns, little-endian int64) and a sequence number (uint64). Without
//	    -publish another process publishes (same payload layout): lbbench prints a line
//	    {"ready": true} once subscribed, then reads one line "SENT WARMUP" from stdin (what
//	    that publisher sent, and how many of its first sequence numbers were warm-up) and
//	    reads on until SENT messages came. Either way it waits at most 10 s for the last
//	    messages after the publishing ended. Latency = receive time (Unix ns, when the
//	    client handed the message over) - send time, for the sequence numbers past the
//	    warm-up; percentiles nearest-rank.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
)

const liveHeader = 16 // send time (int64) + sequence number (uint64)

type options struct {
	addr, stream, ack string
	count, size       int
	window, rate      int
	seconds, warmup   float64
	timeout           time.Duration
	publish           bool
}

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: lbbench create|publish|catchup|live [flags]"))
	}
	mode := os.Args[1]
	var o options
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:9292", "server address")
	fs.StringVar(&o.stream, "stream", "bench", "stream name")
	fs.StringVar(&o.ack, "ack", "leader", "ack policy: leader or all")
	fs.IntVar(&o.count, "count", 100000, "messages")
	fs.IntVar(&o.size, "size", 100, "bytes per message")
	fs.IntVar(&o.window, "window", 1000, "unacknowledged messages at most")
	fs.IntVar(&o.rate, "rate", 10000, "live msgs/s")
	fs.Float64Var(&o.seconds, "seconds", 5, "live seconds measured")
	fs.Float64Var(&o.warmup, "warmup", 0.5, "live seconds of warm-up, not measured")
	fs.DurationVar(&o.timeout, "timeout", 300*time.Second, "bound of the whole mode")
	fs.BoolVar(&o.publish, "publish", false, "live: publish from this process")
	if err := fs.Parse(os.Args[2:]); err != nil {
		fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	client, err := connect(ctx, o.addr)
	if err != nil {
		fail(err)
	}
	defer client.Close()
	var report map[string]any
	switch mode {
	case "create":
		report, err = create(ctx, client, o)
	case "publish":
		report, err = publish(ctx, client, o)
	case "catchup":
		report, err = catchup(ctx, client, o)
	case "live":
		report, err = live(ctx, client, o)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fail(err)
	}
	report["cpu_s"] = cpuSeconds()
	emit(report)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "lbbench:", err)
	os.Exit(1)
}

func emit(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		fail(err)
	}
	fmt.Println(string(line))
}

// cpuSeconds is this process's user + system CPU time so far.
func cpuSeconds() float64 {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return -1
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
}

// connect retries while the server is not accepting yet (it was just started).
func connect(ctx context.Context, addr string) (lift.Client, error) {
	for {
		client, err := lift.Connect([]string{addr}, lift.AckWaitTime(60*time.Second))
		if err == nil {
			return client, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect %s: %w", addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func create(ctx context.Context, client lift.Client, o options) (map[string]any, error) {
	start := time.Now()
	for {
		err := client.CreateStream(ctx, o.stream+".subject", o.stream)
		if err == nil || errors.Is(err, lift.ErrStreamExists) {
			return map[string]any{"stream": o.stream, "seconds": time.Since(start).Seconds()}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("create %s: %w", o.stream, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ackPolicy(name string) (lift.MessageOption, error) {
	switch name {
	case "leader":
		return lift.AckPolicyLeader(), nil
	case "all":
		return lift.AckPolicyAll(), nil
	}
	return nil, fmt.Errorf("unknown ack policy %q", name)
}

// publisher is PublishAsync behind a window of permits, with every ack checked.
type publisher struct {
	client  lift.Client
	stream  string
	policy  lift.MessageOption
	permits chan struct{}
	acked   atomic.Int64
	mu      sync.Mutex
	failure error
	offsets []bool // seen[offset], when counting offsets 0..N-1
	lastAck atomic.Int64
	done    chan struct{}
	want    int64
}

func newPublisher(client lift.Client, o options, want int) (*publisher, error) {
	policy, err := ackPolicy(o.ack)
	if err != nil {
		return nil, err
	}
	return &publisher{
		client: client, stream: o.stream, policy: policy,
		permits: make(chan struct{}, o.window), offsets: make([]bool, want),
		done: make(chan struct{}), want: int64(want),
	}, nil
}

func (p *publisher) onAck(ack *lift.Ack, err error) {
	p.mu.Lock()
	switch {
	case p.failure != nil:
	case err != nil:
		p.failure = err
	case p.offsets == nil: // offsets not counted
	case ack.Offset() < 0 || ack.Offset() >= int64(len(p.offsets)):
		p.failure = fmt.Errorf("ack at offset %d, outside 0..%d", ack.Offset(), len(p.offsets)-1)
	case p.offsets[ack.Offset()]:
		p.failure = fmt.Errorf("offset %d acked twice", ack.Offset())
	default:
		p.offsets[ack.Offset()] = true
	}
	p.mu.Unlock()
	<-p.permits
	p.lastAck.Store(time.Now().UnixNano())
	if p.acked.Add(1) == p.want {
		close(p.done)
	}
}

func (p *publisher) send(ctx context.Context, value []byte) error {
	select {
	case p.permits <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := p.client.PublishAsync(ctx, p.stream, value, p.onAck, p.policy); err != nil {
		<-p.permits
		return err
	}
	return nil
}

func (p *publisher) wait(ctx context.Context) error {
	select {
	case <-p.done:
	case <-ctx.Done():
		return fmt.Errorf("%d of %d acks: %w", p.acked.Load(), p.want, ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failure
}

func publish(ctx context.Context, client lift.Client, o options) (map[string]any, error) {
	payloads := make([][]byte, o.count)
	rng := rand.NewChaCha8([32]byte{byte(o.size), byte(o.count)})
	for i := range payloads {
		payloads[i] = make([]byte, o.size)
		_, _ = rng.Read(payloads[i])
	}
	p, err := newPublisher(client, o, o.count)
	if err != nil {
		return nil, err
	}
	cpu := cpuSeconds()
	start := time.Now()
	for _, value := range payloads {
		if err := p.send(ctx, value); err != nil {
			return nil, fmt.Errorf("publish after %d acks: %w", p.acked.Load(), err)
		}
	}
	if err := p.wait(ctx); err != nil {
		return nil, err
	}
	seconds := time.Duration(p.lastAck.Load() - start.UnixNano()).Seconds()
	return map[string]any{
		"count": o.count, "seconds": seconds, "msgs_per_s": float64(o.count) / seconds,
		"ack": o.ack, "window": o.window, "phase_cpu_s": cpuSeconds() - cpu,
	}, nil
}

func catchup(ctx context.Context, client lift.Client, o options) (map[string]any, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next    int64
		nbytes  int64
		failure error
		last    time.Time
		over    bool
		done    = make(chan struct{})
	)
	handler := func(msg *lift.Message, err error) { // called on one goroutine, in order
		if over {
			return
		}
		switch {
		case err != nil:
			failure = err
		case msg.Offset() != next:
			failure = fmt.Errorf("offset %d where %d was due", msg.Offset(), next)
		default:
			nbytes += int64(len(msg.Value()))
			next++
			if next < int64(o.count) {
				return
			}
			last = time.Now()
		}
		over = true
		close(done)
	}
	cpu := cpuSeconds()
	start := time.Now()
	err := client.Subscribe(ctx, o.stream, handler, lift.StartAtEarliestReceived())
	if err != nil {
		return nil, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("catch-up: %d of %d messages: %w", next, o.count, ctx.Err())
	}
	if failure != nil {
		return nil, failure
	}
	seconds := last.Sub(start).Seconds()
	return map[string]any{
		"count": o.count, "bytes": nbytes, "seconds": seconds,
		"msgs_per_s": float64(o.count) / seconds, "phase_cpu_s": cpuSeconds() - cpu,
	}, nil
}

// liveState collects what the subscriber saw; the handler runs on one goroutine.
type liveState struct {
	mu        sync.Mutex
	latencies []int64
	sequences []uint64
	received  int64
	failure   error
}

func (s *liveState) handle(msg *lift.Message, err error) {
	now := time.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.failure == nil && !errors.Is(err, context.Canceled) {
			s.failure = err
		}
		return
	}
	value := msg.Value()
	if len(value) < liveHeader {
		s.failure = fmt.Errorf("a live message of %d bytes", len(value))
		return
	}
	s.received++
	s.latencies = append(s.latencies, now-int64(binary.LittleEndian.Uint64(value[:8])))
	s.sequences = append(s.sequences, binary.LittleEndian.Uint64(value[8:16]))
}

// measured is the sorted latencies of the sequence numbers from skip on.
func (s *liveState) measured(skip uint64) []int64 {
	var samples []int64
	for i, seq := range s.sequences {
		if seq >= skip {
			samples = append(samples, s.latencies[i])
		}
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	return samples
}

func (s *liveState) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received
}

func live(ctx context.Context, client lift.Client, o options) (map[string]any, error) {
	size := max(o.size, liveHeader)
	warmupCount := int(math.Round(o.warmup * float64(o.rate)))
	total := warmupCount + int(math.Round(o.seconds*float64(o.rate)))
	state := &liveState{}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Subscribe returns once the server's handshake came: the subscription is live.
	if err := client.Subscribe(subCtx, o.stream, state.handle, lift.StartAtNewOnly()); err != nil {
		return nil, err
	}
	report := map[string]any{}
	if o.publish {
		sent, behind, seconds, err := livePublish(ctx, client, o, size, total)
		if err != nil {
			return nil, err
		}
		report["sent"] = sent
		report["achieved_msgs_per_s"] = float64(sent-warmupCount) / seconds
		report["max_behind_schedule_ms"] = behind.Seconds() * 1e3
	} else {
		emit(map[string]any{"ready": true})
		var sent, warmup int
		if _, err := fmt.Fscanln(os.Stdin, &sent, &warmup); err != nil {
			return nil, fmt.Errorf("reading SENT WARMUP from stdin: %w", err)
		}
		total, warmupCount = sent, warmup
	}
	drain := time.Now().Add(10 * time.Second)
	for state.count() < int64(total) && ctx.Err() == nil && time.Now().Before(drain) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.failure != nil {
		return nil, state.failure
	}
	samples := state.measured(uint64(warmupCount))
	report["received"] = state.received
	report["samples"] = len(samples)
	report["missing"] = int64(total) - state.received
	if len(samples) > 0 {
		report["p50_ms"] = ms(percentile(samples, 0.50))
		report["p99_ms"] = ms(percentile(samples, 0.99))
		report["max_ms"] = ms(samples[len(samples)-1])
	}
	return report, nil
}

// livePublish sends total messages at o.rate on an absolute 1 ms clock (rate/1000 per tick),
// PublishAsync with ack LEADER behind a window; it returns once every ack came.
func livePublish(ctx context.Context, client lift.Client, o options, size, total int) (
	int, time.Duration, float64, error) {
	o.ack = "leader"
	p, err := newPublisher(client, o, total)
	if err != nil {
		return 0, 0, 0, err
	}
	p.offsets = nil // a live stream may hold earlier messages: offsets are not counted
	p.permits = make(chan struct{}, max(o.window, 1))
	perTick := max(o.rate/1000, 1)
	interval := time.Duration(float64(time.Second) * float64(perTick) / float64(o.rate))
	warmupCount := int(math.Round(o.warmup * float64(o.rate)))
	filler := make([]byte, size-liveHeader)
	var behind time.Duration
	start := time.Now()
	measured := start
	seq := 0
	for tick := 0; seq < total; tick++ {
		target := start.Add(time.Duration(tick) * interval)
		if d := time.Until(target); d > 0 {
			time.Sleep(d)
		} else {
			behind = max(behind, -d)
		}
		for i := 0; i < perTick && seq < total; i++ {
			if seq == warmupCount {
				measured = time.Now()
			}
			value := make([]byte, size)
			binary.LittleEndian.PutUint64(value[:8], uint64(time.Now().UnixNano()))
			binary.LittleEndian.PutUint64(value[8:16], uint64(seq))
			copy(value[liveHeader:], filler)
			if err := p.send(ctx, value); err != nil {
				return seq, behind, 0, err
			}
			seq++
		}
	}
	seconds := time.Since(measured).Seconds()
	return seq, behind, seconds, p.wait(ctx)
}

func percentile(sorted []int64, q float64) int64 {
	rank := max(int(math.Ceil(q*float64(len(sorted)))), 1)
	return sorted[rank-1]
}

func ms(ns int64) float64 { return math.Round(float64(ns)/1e3) / 1e3 }
