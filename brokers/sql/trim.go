package sql

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/outflow-dev/outflow/brokers"
)

var _ brokers.Trimmer = (*sqlBackend)(nil)

// sqlTrimChunk bounds the rows one DELETE removes, so that trimming a large
// backlog never holds many row locks or one long transaction.
const sqlTrimChunk = 1000

// Trim deletes messages every group has read past. A group has read a row
// when the row's (transaction id, offset) is at or below the group's
// (last_processed_transaction_id, offset_acked): that is the order
// watermill-sql reads in and the position it resumes from, so no group can
// read a deleted row again. Topics are the offsets tables of the schema
// that carry TablePrefix, so a restarted forwarder trims what an earlier
// one created.
func (b *sqlBackend) Trim(ctx context.Context) (int64, error) {
	if b.cfg.SQL.Retention < 0 {
		return 0, nil
	}
	const offsetsPrefix = "watermill_offsets_"
	rows, err := b.pool.Query(ctx, `SELECT substr(tablename, $1) FROM pg_tables
		WHERE schemaname = current_schema() AND starts_with(tablename, $2)`,
		len(offsetsPrefix)+1, offsetsPrefix+b.cfg.SQL.TablePrefix)
	if err != nil {
		return 0, fmt.Errorf("sql broker: list topic tables: %w", err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("sql broker: list topic tables: %w", err)
	}
	var total int64
	for _, topic := range topics {
		if !sqlTopicChars.MatchString(topic) {
			continue // not a table of ours: its name would not be safe to splice
		}
		// created_at is a TIMESTAMP written with CURRENT_TIMESTAMP in the
		// writer's time zone: LOCALTIMESTAMP compares like with like when
		// the sessions share one, as a deployment's pool does.
		query := `DELETE FROM ` + b.schema.MessagesTable(topic) + ` WHERE ctid IN (
			SELECT m.ctid FROM ` + b.schema.MessagesTable(topic) + ` m
			WHERE m.created_at < LOCALTIMESTAMP - make_interval(secs => $1)
			  AND EXISTS (SELECT 1 FROM ` + b.offs.MessagesOffsetsTable(topic) + `)
			  AND NOT EXISTS (SELECT 1 FROM ` + b.offs.MessagesOffsetsTable(topic) + ` g
			      WHERE (m.transaction_id, m."offset") > (g.last_processed_transaction_id, coalesce(g.offset_acked, -1)))
			ORDER BY m.transaction_id, m."offset"
			LIMIT $2)`
		for {
			tag, err := b.pool.Exec(ctx, query, b.cfg.SQL.Retention.Seconds(), sqlTrimChunk)
			if err != nil {
				return total, fmt.Errorf("sql broker: trim topic %q: %w", strings.TrimPrefix(topic, b.cfg.SQL.TablePrefix), err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < sqlTrimChunk {
				break
			}
		}
	}
	return total, nil
}
