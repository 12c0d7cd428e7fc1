package forwarder

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A reset lowers the mark below the lowest id asked for, at the next
// claim, and never raises it.
func TestLowWaterResetBelow(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		mark  int64
		asks  []int64
		want  int64
		again int64 // the mark at the claim after, with no new ask
	}{
		{"no ask", 100, nil, 100, 100},
		{"one ask", 100, []int64{40}, 39, 39},
		{"the lowest ask wins", 100, []int64{40, 10, 70}, 9, 9},
		{"never raises the mark", 5, []int64{40}, 5, 5},
		{"the first id", 100, []int64{1}, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lw := &lowWater{mark: tt.mark, lastFull: time.Now()}
			for _, id := range tt.asks {
				lw.resetBelow(id)
			}
			st := lw.queue(&pgx.Batch{}, time.Now(), time.Hour)
			if st.from != tt.want || lw.mark != tt.want {
				t.Fatalf("claim from %d, mark %d; want %d", st.from, lw.mark, tt.want)
			}
			if st := lw.queue(&pgx.Batch{}, time.Now(), time.Hour); st.from != tt.again {
				t.Fatalf("next claim from %d; want %d", st.from, tt.again)
			}
		})
	}
}

func TestAwaitLostGroups(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_000_000_000)
	earlier := now.Add(-time.Hour).UnixMilli()
	presentOnly := func(names ...string) func(string) bool {
		return func(g string) bool {
			for _, n := range names {
				if n == g {
					return true
				}
			}
			return false
		}
	}
	for _, tt := range []struct {
		name    string
		known   []string
		awaited map[string]int64
		present func(string) bool
		lost    bool
		want    map[string]int64
	}{
		{"nothing known", nil, nil, presentOnly("a"), true, nil},
		{"a group gone, the data intact: removed on purpose", []string{"a", "b"}, nil, presentOnly("a"), false, nil},
		{"a group gone with the data", []string{"a", "b"}, nil, presentOnly("a"), true, map[string]int64{"b": now.UnixMilli()}},
		{"every group gone with the data", []string{"a", "b"}, nil, presentOnly(), true, map[string]int64{"a": now.UnixMilli(), "b": now.UnixMilli()}},
		{"awaited, still missing, the data intact now", []string{"a"}, map[string]int64{"b": earlier}, presentOnly("a"), false, map[string]int64{"b": earlier}},
		{"awaited and lost again: first missed stays", []string{"a"}, map[string]int64{"b": earlier}, presentOnly("a"), true, map[string]int64{"b": earlier}},
		{"awaited, back", nil, map[string]int64{"b": earlier}, presentOnly("a", "b"), false, nil},
		{"awaited for too long: forgotten", nil, map[string]int64{"b": now.Add(-AwaitGroupsFor - time.Minute).UnixMilli()}, presentOnly("a"), false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := AwaitLostGroups(tt.known, tt.awaited, tt.present, tt.lost, now)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for g, since := range tt.want {
				if got[g] != since {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}
