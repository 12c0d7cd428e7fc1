package brokers

import (
	"context"
	"errors"
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

func at(errs []error, i int) error {
	if i < len(errs) {
		return errs[i]
	}
	return nil
}
