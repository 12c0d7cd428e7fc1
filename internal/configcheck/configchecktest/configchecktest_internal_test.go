package configchecktest

import "testing"

// A case is valid only when made with Valid: an Invalid case with no
// expected message still expects an error (it was run as a valid one).
func TestOnlyValidCasesExpectNoError(t *testing.T) {
	for _, tc := range []struct {
		name  string
		c     Case[int]
		valid bool
	}{
		{"valid", Valid("v", 1), true},
		{"invalid with messages", Invalid("i", 1, "X: is required"), false},
		{"invalid without messages", Invalid("i", 1), false},
	} {
		if tc.c.valid != tc.valid {
			t.Errorf("%s: valid = %v, want %v", tc.name, tc.c.valid, tc.valid)
		}
	}
}
