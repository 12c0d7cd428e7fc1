package watermillbackend

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// A group's subscription hands numbered messages out in number order, a
// message delivered again at once, and a number given twice (a publisher
// around the GoChannel that failed after the GoChannel took the message)
// neither holds nor drops either message.
func TestHubHandsOutInNumberOrder(t *testing.T) {
	t.Parallel()
	in := make(chan *message.Message, 10)
	numbered := func(id, n string) *message.Message {
		m := message.NewMessage(id, nil)
		if n != "" {
			m.Metadata.Set(SequenceKey, n)
		}
		return m
	}
	for _, m := range []*message.Message{
		numbered("c", "3"), numbered("b", "2"), numbered("b-again", "2"), numbered("x", ""), numbered("a", "1"), numbered("a-redelivered", "1"),
	} {
		in <- m
	}
	close(in)
	h := &hub{out: make(chan *message.Message)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.run(ctx, in, true)
	var got []string
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case m, ok := <-h.out:
			if !ok {
				done = true
				break
			}
			got = append(got, m.UUID)
		case <-timeout:
			t.Fatalf("got %v, then nothing", got)
		}
	}
	want := []string{"b-again", "x", "a", "b", "c", "a-redelivered"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}
