package consumer

import "errors"

// Ready returns nil while Run's router runs every handler, each subscribed
// to its streams (the router marks itself running only once every handler
// subscribed); before that, while closing and after Run, an error. A worker
// whose broker goes away stays subscribed: a readiness probe checks the
// broker apart. With AddTo the router is the caller's: ask it
// (Router.IsRunning).
func (w *Worker) Ready() error {
	r := w.router.Load()
	if r == nil || !r.IsRunning() || r.IsClosed() {
		return errors.New("consumer: worker not subscribed")
	}
	return nil
}
