package claimcheck_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outflow-dev/outflow/events/claimcheck"
)

// memStore is a Store of the example's own, in memory: any store sits
// behind the interface; Postgres is the default.
type memStore map[string][]byte

func (m memStore) Put(_ context.Context, _ claimcheck.Execer, bodies []claimcheck.Body) error {
	for _, b := range bodies {
		m[b.Ref.ID] = b.Data
	}
	return nil
}

func (m memStore) Get(_ context.Context, ref claimcheck.Ref) ([]byte, error) {
	b, ok := m[ref.ID]
	if !ok {
		return nil, fmt.Errorf("%w: body %s", claimcheck.ErrBodyGone, ref.ID)
	}
	return b, nil
}

// A message whose body travels by reference carries the placeholder and
// the reference; Resolve fetches the body and checks it against the
// reference before anything decodes it. events/outbox's writer does the
// first half (Config.ClaimCheck), package consumer the second.
func ExampleResolve() {
	ctx := context.Background()
	store := memStore{}
	body := []byte(`{"document_id":"doc_1","content":"...100 KB of it..."}`)
	id := "0193a3c4-7b1e-7c3e-9a51-2f4a0d6c1b22"

	// The writer's half: store the body, send the reference.
	ref := claimcheck.NewRef(id, body)
	_ = store.Put(ctx, nil, []claimcheck.Body{{MessageID: id, Ref: ref, Data: body}})
	msg := message.NewMessage(id, []byte(claimcheck.Placeholder))
	ref.SetMetadata(msg.Metadata)
	fmt.Println("on the wire:", string(msg.Payload), msg.Metadata.Get(claimcheck.SizeKey), "bytes by reference")

	// The consumer's half.
	resolved, err := claimcheck.Resolve(ctx, store, msg)
	if err != nil {
		panic(err)
	}
	fmt.Println("handler gets:", string(resolved.Payload))

	// A body changed behind the reference is refused.
	store[id] = []byte(`{"document_id":"doc_1","content":"...100 KB of it!.."}`)
	_, err = claimcheck.Resolve(ctx, store, msg)
	fmt.Println("tampered:", errors.Is(err, claimcheck.ErrBodyTampered))
	// Output:
	// on the wire: {"outflow_body_by_reference":true} 54 bytes by reference
	// handler gets: {"document_id":"doc_1","content":"...100 KB of it..."}
	// tampered: true
}
