package bench

import (
	"context"
	"testing"

	"github.com/outflow-dev/outflow/forwarder"
)

type plainBroker struct{}

func (plainBroker) Publish(context.Context, []forwarder.Outgoing) []error { return nil }

type limitingBroker struct{ plainBroker }

func (limitingBroker) MaxMessageBytes() int                { return 7 }
func (limitingBroker) MessageBytes(forwarder.Outgoing) int { return 3 }

type auditingBroker struct{ plainBroker }

func (auditingBroker) PublishReceipts(context.Context, []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	return nil, nil
}

func (auditingBroker) Check(context.Context, string, []byte, []forwarder.Held, bool) (forwarder.Verdict, error) {
	return forwarder.Verdict{}, nil
}

type auditingLimitingBroker struct{ auditingBroker }

func (auditingLimitingBroker) MaxMessageBytes() int                { return 7 }
func (auditingLimitingBroker) MessageBytes(forwarder.Outgoing) int { return 3 }

// The timing wrapper must leave the forwarder the broker it wraps: an
// Auditor publishes through PublishReceipts, a PayloadLimiter bounds the
// claim, and a wrapper that hid either would measure another forwarder.
func TestTimedKeepsTheBrokersInterfaces(t *testing.T) {
	for _, tc := range []struct {
		name           string
		inner          forwarder.Broker
		audits, limits bool
	}{
		{"plain", plainBroker{}, false, false},
		{"limiter", limitingBroker{}, false, true},
		{"auditor", auditingBroker{}, true, false},
		{"both", auditingLimitingBroker{}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := timed(tc.inner, newStageClock())
			_, audits := b.(forwarder.Auditor)
			l, limits := b.(forwarder.PayloadLimiter)
			if audits != tc.audits || limits != tc.limits {
				t.Fatalf("Auditor %v, PayloadLimiter %v; want %v, %v", audits, limits, tc.audits, tc.limits)
			}
			if limits && (l.MaxMessageBytes() != 7 || l.MessageBytes(forwarder.Outgoing{}) != 3) {
				t.Fatalf("the limits are not the wrapped broker's")
			}
		})
	}
}

func TestQuantileIsNearestRank(t *testing.T) {
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name   string
		sorted []int
		q      float64
		want   int
	}{
		{"empty", nil, 0.99, 0},
		{"one", []int{7}, 0.5, 7},
		{"median of four: the 2nd", []int{1, 2, 3, 4}, 0.5, 2},
		{"p99 of 100: the 99th, not the max", hundred, 0.99, 99},
		{"p50 of 100", hundred, 0.5, 50},
		{"max", hundred, 1, 100},
		{"min", hundred, 0, 1},
	} {
		if got := quantile(tc.sorted, tc.q); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
