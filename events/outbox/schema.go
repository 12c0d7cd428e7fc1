package outbox

import (
	stdsql "database/sql"
	"errors"
	"fmt"
	"strings"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/outflow-dev/outflow/events"
)

// ErrReadNotSupported is returned by the read half of [SchemaAdapter]: the
// outbox is read by the forwarder, which claims rows by state, not by
// Watermill's SQL subscriber.
var ErrReadNotSupported = errors.New("outbox: the outbox table is read by the forwarder, not by a watermill-sql subscriber")

// SchemaAdapter is a watermill-sql v4 schema adapter that writes messages
// carrying an [events.Envelope] as rows of the outbox table (the one named
// "outbox" in the connection's search_path, where the migrations create it
// and the forwarder reads it). Only its write half is implemented.
//
// On its own it does not refuse a non-transactional handle: use [Writer],
// which does.
type SchemaAdapter struct{}

var _ wmsql.SchemaAdapter = SchemaAdapter{}

var insertColumnList = []string{
	"message_id", "topic", "aggregate_type", "aggregate_id", "aggregate_version", "event_type", "payload", "metadata", "occurred_at",
}

var insertColumns = "(" + strings.Join(insertColumnList, ", ") + ")"

// InsertQuery returns one multi-row INSERT for msgs.
func (SchemaAdapter) InsertQuery(params wmsql.InsertQueryParams) (wmsql.Query, error) {
	if len(params.Msgs) == 0 {
		return wmsql.Query{}, errors.New("outbox: no messages to insert")
	}
	var b strings.Builder
	b.WriteString("INSERT INTO outbox ")
	b.WriteString(insertColumns)
	b.WriteString(" VALUES ")
	cols := len(insertColumnList)
	args := make([]any, 0, cols*len(params.Msgs))
	for i, msg := range params.Msgs {
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			return wmsql.Query{}, fmt.Errorf("message %s: %w", msg.UUID, err)
		}
		md, err := extraMetadataJSON(msg.Metadata)
		if err != nil {
			return wmsql.Query{}, fmt.Errorf("message %s: encode metadata: %w", msg.UUID, err)
		}
		if i > 0 {
			b.WriteString(", ")
		}
		n := i * cols
		fmt.Fprintf(&b, "($%d::uuid, $%d, $%d, $%d, $%d, $%d, $%d::jsonb, $%d::jsonb, $%d)",
			n+1, n+2, n+3, n+4, n+5, n+6, n+7, n+8, n+9)
		// Payload and metadata go as text: lib/pq sends []byte as binary,
		// which jsonb's binary input would reject.
		args = append(args, env.MessageID, params.Topic, env.AggregateType, env.AggregateID,
			env.AggregateVersion, env.EventType, string(msg.Payload), md, env.OccurredAt)
	}
	return wmsql.Query{Query: b.String(), Args: args}, nil
}

// SelectQuery is not supported; see [ErrReadNotSupported].
func (SchemaAdapter) SelectQuery(wmsql.SelectQueryParams) (wmsql.Query, error) {
	return wmsql.Query{}, ErrReadNotSupported
}

// UnmarshalMessage is not supported; see [ErrReadNotSupported].
func (SchemaAdapter) UnmarshalMessage(wmsql.UnmarshalMessageParams) (wmsql.Row, error) {
	return wmsql.Row{}, ErrReadNotSupported
}

// SchemaInitializingQueries is not supported: the migrations own the schema.
func (SchemaAdapter) SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams) ([]wmsql.Query, error) {
	return nil, errors.New("outbox: the outbox table is created by the migrations (outflow migrate up)")
}

// SubscribeIsolationLevel is unused: the adapter is write-only.
func (SchemaAdapter) SubscribeIsolationLevel() stdsql.IsolationLevel {
	return stdsql.LevelDefault
}
