package app

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on; the typed errors below match them with
// errors.Is.
var (
	ErrNotFound          = errors.New("not found")
	ErrInvalidTransition = errors.New("invalid state transition")
	ErrInvalidInput      = errors.New("invalid input")
	ErrUnbalanced        = errors.New("ledger transaction is not balanced")
)

// NotFoundError names the missing entity.
type NotFoundError struct {
	Entity string
	ID     string
}

func (e *NotFoundError) Error() string        { return fmt.Sprintf("%s %s not found", e.Entity, e.ID) }
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// TransitionError is returned when a command does not apply to a payment's
// current status.
type TransitionError struct {
	From   Status
	Action string
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("cannot %s a payment that is %s", e.Action, e.From)
}
func (e *TransitionError) Is(target error) bool { return target == ErrInvalidTransition }

// ValidationError names the input field that is wrong.
type ValidationError struct {
	Field   string
	Message string
}

func (e *ValidationError) Error() string        { return e.Field + ": " + e.Message }
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidInput }
