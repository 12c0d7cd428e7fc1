package claimcheck

// PurgeBodiesAt is purgeBodies: PurgeBodies at a given now, so that a
// test moves days forward.
var PurgeBodiesAt = purgeBodies
