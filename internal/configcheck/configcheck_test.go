package configcheck

import (
	"errors"
	"testing"
)

func TestErrors(t *testing.T) {
	sentinel := errors.New("inner")
	tests := []struct {
		name   string
		record func(e *Errors)
		want   string // "" means nil
		wraps  error
	}{
		{"nothing wrong", func(e *Errors) { e.Check(true, "A", "is required") }, "", nil},
		{"one", func(e *Errors) { e.Check(false, "A", "is required") }, "x config: A: is required", nil},
		{"every one, in order", func(e *Errors) {
			e.Check(false, "A", "is required")
			e.Check(true, "B", "is required")
			*e = append(*e, sentinel)
			e.Check(false, "C", "must be positive")
		}, "x config: A: is required\ninner\nC: must be positive", sentinel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e Errors
			tt.record(&e)
			err := e.Err("x config")
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want nil", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Fatalf("got %v, want %q", err, tt.want)
			case tt.wraps != nil && !errors.Is(err, tt.wraps):
				t.Fatalf("%v does not wrap %v", err, tt.wraps)
			}
		})
	}
}
