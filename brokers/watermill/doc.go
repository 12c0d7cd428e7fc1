// Package watermill makes a Watermill publisher and subscriber a
// [brokers.Backend]: the forwarder's broker and the workers' subscribers.
package watermill
