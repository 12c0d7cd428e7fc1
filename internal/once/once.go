// Package once runs a creation once per key per process.
package once

import "sync"

// ByKey runs a creation (a stream, a topic, tables, a queue) once per key
// per process. Only a success is remembered, so a failed creation is tried
// again on the next call. Creations run one at a time: they are rare and the
// broker would serialise them anyway. The zero value is ready to use.
type ByKey struct {
	mu   sync.Mutex
	done map[string]bool
}

// Do runs create unless a previous Do for key succeeded.
func (o *ByKey) Do(key string, create func() error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done[key] {
		return nil
	}
	if err := create(); err != nil {
		return err
	}
	if o.done == nil {
		o.done = map[string]bool{}
	}
	o.done[key] = true
	return nil
}
