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
// neither holds nor drops either message. Numbers of another topic (a
// message a PoisonQueue copied, metadata and all) or of another numbering
// (another GoChannel's, or a bare number) are not its own: handed out at
// once, never held for numbers that do not come. What it hands out carries
// no number.
func TestHubHandsOutInNumberOrder(t *testing.T) {
	t.Parallel()
	const prefix = "s1:orders:"
	in := make(chan *message.Message, 16)
	numbered := func(id, n string) *message.Message {
		m := message.NewMessage(id, nil)
		if n != "" {
			m.Metadata.Set(SequenceKey, n)
		}
		return m
	}
	for _, m := range []*message.Message{
		numbered("c", prefix+"3"), numbered("b", prefix+"2"), numbered("b-again", prefix+"2"), numbered("x", ""),
		numbered("other-topic", "s1:orders.dead:5"), numbered("other-numbering", "s2:orders:5"), numbered("bare", "5"),
		numbered("a", prefix+"1"), numbered("a-redelivered", prefix+"1"),
	} {
		in <- m
	}
	close(in)
	h := &hub{out: make(chan *message.Message)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.run(ctx, in, prefix)
	var got []string
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case m, ok := <-h.out:
			if !ok {
				done = true
				break
			}
			if v := m.Metadata.Get(SequenceKey); v != "" {
				t.Fatalf("%s handed out with its number %q", m.UUID, v)
			}
			got = append(got, m.UUID)
		case <-timeout:
			t.Fatalf("got %v, then nothing", got)
		}
	}
	want := []string{"b-again", "x", "other-topic", "other-numbering", "bare", "a", "b", "c", "a-redelivered"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}
