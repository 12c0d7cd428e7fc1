//go:build !linux

package cli

import "os"

// isTerminal reports whether f is a character device other than the null
// device: close enough to a terminal where the Linux ioctl is not at hand.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}
