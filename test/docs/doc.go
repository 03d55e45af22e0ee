// Package docs holds checks on the documentation that no Go package owns:
// that each translation under docs/zh/ was made from the English page as it
// stands, and names nothing the English pages do not.
package docs
