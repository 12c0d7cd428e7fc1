package consumer

import "slices"

// Groups lists, per topic, the consumer groups of the handlers added so far
// (a handler's Name is its group), each handler's replay topic included:
// what brokers.AMQPConfig.Groups needs, so that RabbitMQ keeps what the
// forwarder publishes before a handler's first subscription. Pass the same
// to the forwarder's configuration.
func (w *Worker) Groups() map[string][]string { return HandlerGroups(w.handlers...) }

// HandlerGroups lists, per topic, the consumer groups of hs, for a process
// that configures the forwarder without building a Worker.
func HandlerGroups(hs ...Handler) map[string][]string {
	out := map[string][]string{}
	for _, h := range hs {
		if !slices.Contains(out[h.Topic], h.Name) {
			out[h.Topic] = append(out[h.Topic], h.Name)
		}
		if !h.NoReplay {
			out[ReplayTopic(h.Name)] = []string{h.Name}
		}
	}
	return out
}
