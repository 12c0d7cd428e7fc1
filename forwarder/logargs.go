package forwarder

import (
	"encoding/json"

	"github.com/outflow-dev/outflow/events"
)

// logArgs are the correlation and trace ids of r for a log line about it,
// from its metadata column; none when the column does not parse.
func (r row) logArgs() []any {
	var md map[string]string
	if json.Unmarshal([]byte(r.metadata), &md) != nil {
		return nil
	}
	return events.MetadataLogArgs(md[events.CorrelationIDKey], md[events.TraceparentKey])
}
