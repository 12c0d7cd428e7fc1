package outbox

import (
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/events"
)

// columnKeys are the envelope fields the outbox keeps in columns of their
// own; the metadata column holds the rest (correlation id, traceparent,
// anything a user adds), so no row carries its envelope twice.
var columnKeys = []string{
	events.MessageIDKey, events.EventTypeKey, events.AggregateTypeKey,
	events.AggregateIDKey, events.AggregateVersionKey, events.OccurredAtKey,
}

func extraMetadataJSON(md message.Metadata) (string, error) {
	extra := make(map[string]string, len(md))
	for k, v := range md {
		extra[k] = v
	}
	for _, k := range columnKeys {
		delete(extra, k)
	}
	if len(extra) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(extra)
	return string(b), err
}
