package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// stmtStats times a pool's statements by kind (see classify), single and
// batched (a batch counts as its classified statement, BEGIN and COMMIT
// included): where a benchmark's time goes in PostgreSQL, with no
// extension installed.
type stmtStats struct {
	classify func(sql string) string
	mu       sync.Mutex
	on       bool
	by       map[string]*stmtKind
}

type stmtKind struct {
	rows int64
	d    []time.Duration
}

func newStmtStats(classify func(string) string) *stmtStats {
	return &stmtStats{classify: classify, by: map[string]*stmtKind{}}
}

// start begins counting (setup statements before it are not).
func (s *stmtStats) start() {
	s.mu.Lock()
	s.on, s.by = true, map[string]*stmtKind{}
	s.mu.Unlock()
}

func (s *stmtStats) add(kind string, d time.Duration, rows int64) {
	if kind == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.on {
		return
	}
	k := s.by[kind]
	if k == nil {
		k = &stmtKind{}
		s.by[kind] = k
	}
	k.rows += rows
	k.d = append(k.d, d)
}

type stmtStart struct {
	at   time.Time
	kind string
	rows int64
}

type stmtKey struct{}

func (s *stmtStats) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, stmtKey{}, &stmtStart{at: time.Now(), kind: s.classify(data.SQL)})
}

func (s *stmtStats) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if st, ok := ctx.Value(stmtKey{}).(*stmtStart); ok {
		s.add(st.kind, time.Since(st.at), data.CommandTag.RowsAffected())
	}
}

func (s *stmtStats) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, stmtKey{}, &stmtStart{at: time.Now(), kind: "other (batch)"})
}

func (s *stmtStats) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if st, ok := ctx.Value(stmtKey{}).(*stmtStart); ok {
		if k := s.classify(data.SQL); k != "" && k != "begin" && k != "commit" && k != "other" {
			st.kind, st.rows = k, data.CommandTag.RowsAffected()
		}
	}
}

func (s *stmtStats) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if st, ok := ctx.Value(stmtKey{}).(*stmtStart); ok {
		s.add(st.kind, time.Since(st.at), st.rows)
	}
}

// print writes a table of the statements timed since start, over a run of
// length d.
func (s *stmtStats) print(out io.Writer, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make([]string, 0, len(s.by))
	for k := range s.by {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	fmt.Fprintf(out, "| statement | count | rows each | mean ms | p99 ms | max ms | busy (sum / run time) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, name := range kinds {
		k := s.by[name]
		slices.Sort(k.d)
		var sum time.Duration
		for _, d := range k.d {
			sum += d
		}
		n := len(k.d)
		fmt.Fprintf(out, "| %s | %d | %.1f | %.2f | %.2f | %.2f | %.0f%% |\n", name, n, float64(k.rows)/float64(n),
			ms(sum)/float64(n), ms(quantile(k.d, 0.99)), ms(k.d[n-1]), 100*sum.Seconds()/d.Seconds())
	}
}

// webhookStatement names the webhooks packages' statements.
func webhookStatement(sql string) string {
	switch {
	case strings.Contains(sql, "AS b(endpoint_id, n)"):
		return "sender lease (batch)"
	case strings.Contains(sql, "AS r(id, token, endpoint_id"):
		return "sender settle (batch)"
	case strings.Contains(sql, "INSERT INTO webhook_messages"):
		return "fanout.Enqueue"
	case strings.EqualFold(sql, "begin"):
		return "begin"
	case strings.EqualFold(sql, "commit"):
		return "commit"
	}
	return "other"
}
