package netguard_test

import (
	"fmt"

	"github.com/outflow-dev/outflow/internal/netguard"
)

func ExamplePolicy_CheckURL() {
	for _, u := range []string{
		"https://shop.example/hooks",
		"http://shop.example/hooks",
		"https://[::ffff:169.254.169.254]/latest/meta-data",
		"https://0x7f.1:6379/",
	} {
		if _, err := (netguard.Policy{}).CheckURL(u); err != nil {
			fmt.Println("refused:", err)
			continue
		}
		fmt.Println("accepted:", u)
	}
	// Output:
	// accepted: https://shop.example/hooks
	// refused: must be an https URL
	// refused: must not point at a private, loopback or link-local address
	// refused: must not point at a private, loopback or link-local address
}
