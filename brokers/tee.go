package brokers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/outflow-dev/outflow/forwarder"
)

// Tee publishes every message to both brokers, for a live cutover from one
// to the other: a message counts as published only when both acknowledged
// it, so a failure on either side sends it again to both (a duplicate with
// the same message id, which the consumers' deduplication absorbs). Both
// sides get each aggregate's messages in order, as each broker does.
//
// The cutover, with no event lost and no effect twice because
// deduplication lives in the consumers' database, not in a broker:
//
//  1. Run the forwarder with Tee(old, new) (`outflow forward --broker old
//     --cutover-to new`); from its first batch every new event is on both.
//  2. Start workers on the new broker with the same handler names (they are
//     the consumer groups and the deduplication keys). Both sets of workers
//     now apply each event once between them.
//  3. When the old broker's consumer groups have nothing left that was
//     published before step 1, stop the workers on the old broker.
//  4. Run the forwarder on the new broker alone.
func Tee(old, new forwarder.Broker) forwarder.Broker { return tee{old, new} }

type tee struct{ a, b forwarder.Broker }

func (t tee) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	var (
		ea, eb []error
		wg     sync.WaitGroup
	)
	// Copies: brokers may set a message's context; the two sides must not
	// share one.
	other := make([]forwarder.Outgoing, len(msgs))
	for i, m := range msgs {
		other[i] = m
		other[i].Message = m.Message.Copy()
	}
	wg.Go(func() { ea = t.a.Publish(ctx, msgs) })
	wg.Go(func() { eb = t.b.Publish(ctx, other) })
	wg.Wait()
	errs := make([]error, len(msgs))
	for i := range msgs {
		errs[i] = errors.Join(at(ea, i), at(eb, i))
	}
	return errs
}

// at is errs[i]; a side that returned no result for message i did not
// acknowledge it, so that counts as the broker's failure, as the
// forwarder counts it.
func at(errs []error, i int) error {
	if i < len(errs) {
		return errs[i]
	}
	return fmt.Errorf("%w: the broker returned %d results, none for message %d", forwarder.ErrBrokerUnavailable, len(errs), i)
}

var _ forwarder.PayloadLimiter = tee{}

// limits lists the sides with a payload limit, and their limits.
func (t tee) limits() ([]forwarder.PayloadLimiter, []int) {
	var (
		ls     []forwarder.PayloadLimiter
		limits []int
	)
	for _, side := range []forwarder.Broker{t.a, t.b} {
		if l, ok := side.(forwarder.PayloadLimiter); ok {
			if n := l.MaxMessageBytes(); n > 0 {
				ls, limits = append(ls, l), append(limits, n)
			}
		}
	}
	return ls, limits
}

// MaxMessageBytes is the smaller of the two sides' limits (0: neither has
// one).
func (t tee) MaxMessageBytes() int {
	_, limits := t.limits()
	if len(limits) == 0 {
		return 0
	}
	return slices.Min(limits)
}

// MessageBytes is m's size against MaxMessageBytes: the smaller limit plus
// m's largest excess over a side's own limit, so that m is over the Tee's
// limit exactly when it is over one side's (each side counts its own way:
// headers, key, framing).
func (t tee) MessageBytes(m forwarder.Outgoing) int {
	ls, limits := t.limits()
	if len(ls) == 0 {
		return 0
	}
	excess := math.MinInt
	for i, l := range ls {
		excess = max(excess, l.MessageBytes(m)-limits[i])
	}
	return slices.Min(limits) + excess
}

var _ forwarder.MetadataAdder = tee{}

// AddedMetadataBytes is the larger of what the two sides add to m's
// metadata at publish (their CloudEvents attributes).
func (t tee) AddedMetadataBytes(m forwarder.Outgoing) int {
	n := 0
	for _, side := range []forwarder.Broker{t.a, t.b} {
		if a, ok := side.(forwarder.MetadataAdder); ok {
			n = max(n, a.AddedMetadataBytes(m))
		}
	}
	return n
}
