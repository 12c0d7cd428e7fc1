package forwarder

import (
	"maps"
	"testing"
)

func TestParseSnapshot(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in         string
		ok         bool
		xmin, xmax uint64
		xip        []uint64
	}{
		{"100:105:", true, 100, 105, nil},
		{"100:105:100,103", true, 100, 105, []uint64{100, 103}},
		{"garbage", false, 0, 0, nil},
		{"1:x:", false, 0, 0, nil},
	} {
		sn, ok := parseSnapshot(tt.in)
		if ok != tt.ok || sn.xmin != tt.xmin || sn.xmax != tt.xmax || len(sn.xip) != len(tt.xip) {
			t.Fatalf("%q: got %v %+v", tt.in, ok, sn)
		}
		for _, x := range tt.xip {
			if !sn.xip[x] {
				t.Fatalf("%q: %d not in progress", tt.in, x)
			}
		}
	}
	sn, _ := parseSnapshot("100:105:100,103")
	for x, want := range map[uint64]bool{99: true, 100: false, 101: true, 103: false, 104: true, 105: false, 200: false} {
		if sn.shows(x) != want {
			t.Fatalf("shows(%d) = %v", x, !want)
		}
	}
}

func TestXid8(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		xmax uint64
		xid  uint32
		want uint64
	}{
		{105, 103, 103},
		{105, 107, 107},                       // running at or above xmax
		{1<<32 + 5, 4294967290, 4294967290},   // before the epoch turned
		{1<<32 - 3, 2, 1<<32 + 2},             // after it
		{3<<32 + 1000, 999, 3<<32 + 999},      // a later epoch
		{3<<32 + 1000, 4294967295, 3<<32 - 1}, // the previous one
	} {
		if got := (snapshot{xmax: tt.xmax}).xid8(tt.xid); got != tt.want {
			t.Fatalf("xid8(%d) near %d = %d, want %d", tt.xid, tt.xmax, got, tt.want)
		}
	}
}

// The cursor's decisions, one claim at a time: the highs move to what the
// claim read, never past a row not sent; a transaction running is tracked
// with a bound below its ids, and holds the durable points back until it
// is done with.
func TestCursorAdvance(t *testing.T) {
	t.Parallel()
	snap := func(xmin, xmax uint64, xip ...uint64) snapshot {
		s := snapshot{xmin: xmin, xmax: xmax, xip: map[uint64]bool{}}
		for _, x := range xip {
			s.xip[x] = true
		}
		return s
	}
	c := newCursor()
	c.own(map[int32]int64{0: 10, 1: 20})

	// First claim: L=30, fewer rows than the limit, transactions 50 (in
	// the snapshot's list) and 52 (at its xmax: not listed) running; 49
	// was running when the locks were read and committed before the
	// snapshot.
	c.advance(30, []uint32{49, 50, 52}, snap(50, 52, 50), 3, 100, 29, nil, nil, nil)
	if want := map[int32]int64{0: 30, 1: 30}; !maps.Equal(c.high, want) {
		t.Fatalf("highs %v, want %v", c.high, want)
	}
	if len(c.tracked) != 2 || c.tracked["50"] != 10 || c.tracked["52"] != 10 {
		t.Fatalf("tracked %v: 50 and 52, bound at the lowest cursor, 10", c.tracked)
	}
	if want := map[int32]int64{0: 10, 1: 10}; !maps.Equal(c.durableThrough(), want) {
		t.Fatalf("durable %v, want %v: held back", c.durableThrough(), want)
	}

	// Second: L=40, limit hit at 35; 55 is new (no xid at the last claim:
	// its ids are above 30); a row of partition 1 at 33 not sent.
	c.advance(40, []uint32{50, 52, 55}, snap(50, 53, 50, 52), 100, 100, 35, nil, map[int32]int64{1: 33}, nil)
	if want := map[int32]int64{0: 35, 1: 32}; !maps.Equal(c.high, want) {
		t.Fatalf("highs %v, want %v", c.high, want)
	}
	if c.tracked["55"] != 30 {
		t.Fatalf("55's bound %d, want 30 (L at the previous claim)", c.tracked["55"])
	}

	// Third: 50 and 55 ended (50 committed, a late row of it not sent:
	// tracked on), 52 runs on.
	c.advance(45, []uint32{52}, snap(52, 60, 52), 0, 100, 0, nil, nil, map[string]bool{"50": true})
	if _, ok := c.tracked["50"]; !ok {
		t.Fatalf("50 dropped with a late row unsent")
	}
	if _, ok := c.tracked["55"]; ok {
		t.Fatalf("55, no longer running, still tracked")
	}
	c.advance(46, nil, snap(60, 60), 0, 100, 0, nil, nil, nil)
	if len(c.tracked) != 0 {
		t.Fatalf("tracked %v after every transaction ended", c.tracked)
	}
	if want := map[int32]int64{0: 46, 1: 46}; !maps.Equal(c.durableThrough(), want) {
		t.Fatalf("durable %v, want %v", c.durableThrough(), want)
	}
}

// A partition newly owned starts at its published_through, and brings the
// bounds of the transactions tracked down to it; one no longer owned is
// forgotten.
func TestCursorOwn(t *testing.T) {
	t.Parallel()
	c := newCursor()
	c.own(map[int32]int64{0: 100})
	c.tracked["7"] = 90
	c.own(map[int32]int64{0: 100, 1: 50})
	if c.high[1] != 50 || c.tracked["7"] != 50 {
		t.Fatalf("high %v tracked %v", c.high, c.tracked)
	}
	c.own(map[int32]int64{1: 50})
	if _, ok := c.high[0]; ok {
		t.Fatalf("partition 0 still followed: %v", c.high)
	}
}

// A tracked transaction that writes no outbox row holds nothing back once
// the claim saw it running without a lock on the outbox; one that ended
// since the claim's snapshot keeps its bound: it holds no lock any more,
// but it may have committed rows the snapshot did not show. One listed
// without a lock that the claim's snapshot shows committed (it released
// its table locks, then committed, between the two reads) keeps its bound
// too, and the durable points stay below its rows: the claim read them as
// late rows, and its batch has not published them yet.
func TestCursorRebound(t *testing.T) {
	t.Parallel()
	c := newCursor()
	c.own(map[int32]int64{0: 100})
	c.tracked["4294967297"] = 10 // xid8 2^32+1: xid 1 in pg_locks
	c.tracked["8"] = 10
	c.tracked["9"] = 10  // ended between the snapshot and the locks read
	c.tracked["12"] = 10 // committed between the locks read and the snapshot
	sn, _ := parseSnapshot("8:13:8")
	c.rebound(120, map[string]bool{"1": true, "8": false, "12": false}, sn, c.rebounded)
	if c.tracked["4294967297"] != 10 || c.tracked["8"] != 120 || c.tracked["9"] != 10 || c.tracked["12"] != 10 {
		t.Fatalf("tracked %v", c.tracked)
	}
	if got := c.durableThrough()[0]; got != 10 {
		t.Fatalf("durable through %d, want 10: the committed writer's rows are not published yet", got)
	}
}

// Rows read above L (their transactions committed between the reads of L
// and of the snapshot) are remembered, skipped by the next claims, and
// forgotten once the highs pass them; the highs never pass L, nor, when
// the limit was hit, the last row read.
func TestCursorReadsAhead(t *testing.T) {
	t.Parallel()
	c := newCursor()
	c.own(map[int32]int64{0: 0})
	c.advance(12, nil, snapshot{xmin: 9, xmax: 9}, 27, 100, 27, []int64{11, 12, 13, 20, 27}, nil, nil)
	if c.high[0] != 12 || len(c.ahead) != 3 || !c.ahead[13] || !c.ahead[20] || !c.ahead[27] {
		t.Fatalf("high %d ahead %v", c.high[0], c.ahead)
	}
	c.advance(25, nil, snapshot{xmin: 9, xmax: 9}, 3, 3, 30, []int64{28, 29, 30}, nil, nil)
	if c.high[0] != 25 || len(c.ahead) != 4 || !c.ahead[27] || !c.ahead[30] || c.ahead[20] {
		t.Fatalf("limit hit: high %d ahead %v", c.high[0], c.ahead)
	}
}
