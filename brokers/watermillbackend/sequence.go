package watermillbackend

import (
	"runtime"
	"strconv"
	"strings"
	"sync"
	"weak"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// SequenceKey is the metadata key of a message's number in its topic, which
// the backend sets on what it publishes when Config.Subscriber is a
// GoChannel.
//
// A GoChannel hands each message to each subscription in a goroutine of its
// own, and a new subscription gets the topic's history the same way, so
// what was published in one order arrives in any: an aggregate's next
// event could reach a consumer before the one the forwarder published (and
// saw acknowledged) first. The backend numbers each topic's messages as it
// publishes them, one after the other, and a group's subscription hands
// them to its consumers in that order, holding one that came early until
// those before it came. Every subscription of a persistent GoChannel gets
// the topic from its first message, so the numbering starts at 1 for each.
//
// The value names the numbering (the GoChannel's, one random word), the
// topic and the number, and a group's subscription honours only its own
// GoChannel's numbers of its own topic: a message copied with its metadata
// to another topic (Watermill's PoisonQueue, a handler returning the message)
// or another GoChannel would otherwise be held for a number that never
// comes. The key is removed from what is handed to a consumer, so such a
// copy does not even carry it.
const SequenceKey = "outflow_watermill_seq"

// sequencer numbers the messages of one GoChannel, whichever Backend
// publishes to it: two numberings of one topic would hold messages back
// for numbers that never come.
type sequencer struct {
	id   string // names this numbering in SequenceKey's values
	mu   sync.Mutex
	last map[string]uint64 // topic: the last number given
}

// sequencers is the sequencer of each GoChannel alive.
var sequencers sync.Map // weak.Pointer[gochannel.GoChannel]: *sequencer

func sequencerOf(gc *gochannel.GoChannel) *sequencer {
	k := weak.Make(gc)
	s, loaded := sequencers.LoadOrStore(k, &sequencer{id: watermill.NewShortUUID(), last: map[string]uint64{}})
	if !loaded {
		runtime.AddCleanup(gc, func(k weak.Pointer[gochannel.GoChannel]) { sequencers.Delete(k) }, k)
	}
	return s.(*sequencer)
}

// numbered is the Publisher numbering what it publishes.
type numbered struct {
	message.Publisher
	seq *sequencer
}

// Publish numbers copies of msgs (the caller's are left as they are) and
// publishes them, under the sequencer's lock so that numbers follow the
// order of publishing; on failure the numbers are given again.
func (p numbered) Publish(topic string, msgs ...*message.Message) error {
	out := make([]*message.Message, len(msgs))
	p.seq.mu.Lock()
	defer p.seq.mu.Unlock()
	n := p.seq.last[topic]
	for i, m := range msgs {
		c := m.Copy()
		c.SetContext(m.Context())
		c.Metadata.Set(SequenceKey, p.seq.prefix(topic)+strconv.FormatUint(n+uint64(i)+1, 10))
		out[i] = c
	}
	if err := p.Publisher.Publish(topic, out...); err != nil {
		return err
	}
	p.seq.last[topic] = n + uint64(len(msgs))
	return nil
}

// prefix is what SequenceKey's values of topic start with, the number
// following. A topic holding the separator cannot pass for another: what
// follows the prefix must be digits only.
func (s *sequencer) prefix(topic string) string { return s.id + ":" + topic + ":" }

// sequenceOf is m's number when it carries one of prefix's numbering and
// topic.
func sequenceOf(m *message.Message, prefix string) (uint64, bool) {
	v, ok := strings.CutPrefix(m.Metadata.Get(SequenceKey), prefix)
	if !ok || v == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil && n > 0
}
