package kafka

import "testing"

// A subscription joins its group again for another topic of the same name:
// one with another id, or one back after a check found it missing.
func TestTopicWatch(t *testing.T) {
	x := topicIdentity{exists: true, id: "x"}
	y := topicIdentity{exists: true, id: "y"}
	noID := topicIdentity{exists: true}
	gone := topicIdentity{}
	for _, tc := range []struct {
		name       string
		subscribed topicIdentity
		checks     []topicIdentity
		want       []bool
	}{
		{"same topic", x, []topicIdentity{x, x}, []bool{false, false}},
		{"another id", x, []topicIdentity{y, y, x}, []bool{true, false, true}},
		{"missing, then back with its id", x, []topicIdentity{gone, gone, x, x}, []bool{false, false, true, false}},
		{"missing, then back with another", x, []topicIdentity{gone, y, y}, []bool{false, true, false}},
		{"no ids: only a topic found missing tells", noID, []topicIdentity{noID, gone, noID, noID}, []bool{false, false, true, false}},
		{"an id showing up is the same topic", noID, []topicIdentity{x, x, y}, []bool{false, false, true}},
		{"missing when subscribed", gone, []topicIdentity{gone, x, x}, []bool{false, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := topicWatch{subscribed: tc.subscribed}
			for i, cur := range tc.checks {
				if got := w.recreated(cur); got != tc.want[i] {
					t.Fatalf("check %d (%+v): recreated %v, want %v", i, cur, got, tc.want[i])
				}
			}
		})
	}
}
