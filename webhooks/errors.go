package webhooks

import "errors"

// ErrNotFound is returned for an endpoint, message or delivery that does
// not exist, or belongs to another account: the two are not told apart, so
// that an account learns nothing of another's.
var ErrNotFound = errors.New("not found")

// ValidationError is bad input, naming the field as the JSON names it.
type ValidationError struct {
	Field   string
	Message string
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Message }
