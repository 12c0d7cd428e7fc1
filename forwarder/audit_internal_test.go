package forwarder

import (
	"testing"
	"time"
)

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
