package outbox

// JSONBTextLen exposes jsonbTextLen to the tests, which compare it with
// PostgreSQL's own.
var JSONBTextLen = jsonbTextLen
