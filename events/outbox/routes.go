package outbox

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/outflow-dev/outflow/events"
)

// ErrNoRoute is returned for an event type that Routes does not map.
var ErrNoRoute = errors.New("outbox: no topic for event type")

// Routes maps an event type to the topic its events go to. The key "*" is
// the fallback for types not listed. A nil Routes sends every event to a
// topic named after its aggregate type, which keeps all events of one
// aggregate on one topic: the precondition for per-aggregate order.
//
//	outbox.Routes{"payment.created": "payments", "payment.paid": "payments", "*": "misc"}
type Routes map[string]string

// Topic returns the topic for env.
func (r Routes) Topic(env events.Envelope) (string, error) {
	if r == nil {
		return env.AggregateType, nil
	}
	if t, ok := r[env.EventType]; ok {
		return t, nil
	}
	if t, ok := r["*"]; ok {
		return t, nil
	}
	return "", fmt.Errorf("%w %q", ErrNoRoute, env.EventType)
}

// Topic names are what watermill-sql and every broker we support accept.
var topicRE = regexp.MustCompile(`^[A-Za-z0-9\-\$\:\.\_]+$`)

func (r Routes) validate() error {
	for typ, topic := range r {
		if !topicRE.MatchString(topic) {
			return fmt.Errorf("topic %q for %q: only letters, digits and - $ : . _ are allowed", topic, typ)
		}
	}
	return nil
}
