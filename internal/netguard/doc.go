// Package netguard decides which network destinations an outbound request
// made on a customer's behalf (a webhook) may reach, so that the service
// cannot be aimed at its own network: loopback, private, link-local (cloud
// metadata), CGNAT, unique-local, multicast and unspecified addresses, in
// any spelling (IPv4-mapped and IPv4-compatible IPv6 included).
//
// [CheckURL] is the early, syntactic check made when a URL is stored: it
// refuses literal addresses and names that are loopback by definition, but
// cannot know where another name will resolve. [Dialer] is the
// authoritative check: it resolves the name at every connection, refuses
// the connection if any address is not public, and dials the checked
// address itself, so a name re-pointed between check and use (DNS
// rebinding) gains nothing.
package netguard
