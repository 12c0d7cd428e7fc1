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
