package forwarder

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A tick's receipts go in rows of at most receiptsPerRow, each row's
// arrays in step: the audit bounds its work by rows and receipts.
func TestReceiptSetQueuesBoundedRows(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		n    int
		rows []int
	}{
		{0, nil},
		{1, []int{1}},
		{receiptsPerRow, []int{receiptsPerRow}},
		{2*receiptsPerRow + 500, []int{receiptsPerRow, receiptsPerRow, 500}},
	} {
		var s receiptSet
		for i := range tt.n {
			s.add(int64(i), Receipt{BrokerTopic: "t", Position: strconv.Itoa(i)})
		}
		b := &pgx.Batch{}
		s.queue(b)
		if len(b.QueuedQueries) != len(tt.rows) {
			t.Fatalf("%d receipts: %d rows, want %d", tt.n, len(b.QueuedQueries), len(tt.rows))
		}
		next := int64(0)
		for i, q := range b.QueuedQueries {
			ids, topics, positions := q.Arguments[0].([]int64), q.Arguments[1].([]string), q.Arguments[2].([]string)
			if len(ids) != tt.rows[i] || len(topics) != len(ids) || len(positions) != len(ids) || ids[0] != next || positions[0] != strconv.FormatInt(next, 10) {
				t.Fatalf("%d receipts, row %d: %d ids from %d, %d topics, %d positions", tt.n, i, len(ids), ids[0], len(topics), len(positions))
			}
			next += int64(len(ids))
		}
	}
}
