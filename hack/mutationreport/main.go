// Command mutationreport reads the JSON results gremlins wrote for each
// package (`gremlins unleash -o`) and prints, per package, the test efficacy
// and mutator coverage beside the project's goal, then every mutant that
// survived, with the source line it mutated.
//
// A survivor that cannot change behaviour is listed in the equivalent-mutant
// file (hack/mutation-equivalent.txt) with the reason. As in the usual
// mutation score, listed equivalents leave the efficacy's denominator:
// efficacy = killed / (killed + lived - equivalent). gremlins' own figure,
// which counts them as lived, is printed beside it. Entries that no longer
// match a survivor are reported as stale, so the list stays short.
//
// Usage: mutationreport [-goal 90] [-equivalent FILE] [-root DIR] PKGDIR=RESULT.json...
//
// PKGDIR is the package directory relative to the module root (gremlins names
// files relative to the directory it ran in). The exit status is 1 when a
// package misses the goal or has an unexplained survivor.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// gremlins' JSON output (internal/report/internal/structure.go in gremlins).
type result struct {
	Files []struct {
		Filename  string `json:"file_name"`
		Mutations []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Line   int    `json:"line"`
			Column int    `json:"column"`
		} `json:"mutations"`
	} `json:"files"`
}

// Statuses as gremlins spells them.
const (
	statusKilled     = "KILLED"
	statusLived      = "LIVED"
	statusTimedOut   = "TIMED OUT"
	statusNotCovered = "NOT COVERED"
	statusNotViable  = "NOT VIABLE"
)

// mutant is one surviving mutant, located in the module.
type mutant struct {
	file   string // module-relative, slash-separated
	line   int
	column int
	kind   string // gremlins' mutator type, e.g. CONDITIONALS_BOUNDARY
	nth    int    // which mutant of its kind on its line, counted from the left
	of     int    // how many of its kind the line has
	code   string // the mutated source line, whitespace-normalised
	reason string // why it is equivalent; empty when unexplained
}

// equivalent is one entry of the equivalent-mutant list. It covers the
// mutants of its kind on any line of file whose code matches (so it survives
// edits that only move the line): all of them, or with kind written
// TYPE#N only the Nth from the left.
type equivalent struct {
	file, kind, code, reason string
	nth                      int // 0: every mutant of the kind on the line
	at                       int // line in the list, for messages
	used                     bool
}

func (e *equivalent) matches(m mutant) bool {
	return e.file == m.file && e.kind == m.kind && e.code == m.code && (e.nth == 0 || e.nth == m.nth)
}

// packageReport is one package's counts.
type packageReport struct {
	dir                                            string
	killed, lived, timedOut, notCovered, notViable int
	survivors                                      []mutant
	explained                                      int
}

// efficacy leaves listed equivalent mutants out: they are not bugs a test
// could see.
func (p packageReport) efficacy() (float64, bool) {
	covered := p.killed + p.lived
	if covered == 0 {
		return 0, false
	}
	if covered == p.explained {
		return 100, true // every covered mutant is equivalent
	}
	return 100 * float64(p.killed) / float64(p.killed+p.lived-p.explained), true
}

// rawEfficacy is gremlins' figure, equivalents counted as lived.
func (p packageReport) rawEfficacy() (float64, bool) {
	if p.killed+p.lived == 0 {
		return 0, false
	}
	return 100 * float64(p.killed) / float64(p.killed+p.lived), true
}

func (p packageReport) coverage() (float64, bool) {
	if p.killed+p.lived+p.notCovered == 0 {
		return 0, false
	}
	return 100 * float64(p.killed+p.lived) / float64(p.killed+p.lived+p.notCovered), true
}

func (p packageReport) noMutants() bool {
	return p.killed+p.lived+p.timedOut+p.notCovered+p.notViable == 0
}

// meetsGoal: efficacy at or above the goal and every survivor explained. A
// package whose mutants no test reaches does not meet it; one without any
// mutation point does.
func (p packageReport) meetsGoal(goal float64) bool {
	if p.noMutants() {
		return true
	}
	e, ok := p.efficacy()
	return ok && e >= goal && p.explained == len(p.survivors)
}

// parseEquivalents reads the list. Each entry is a line
//
//	<module-relative file> <MUTATOR_TYPE>[#N] <source line as written>
//
// followed by one or more indented lines saying why the mutant cannot change
// behaviour. Blank lines and lines starting with # are ignored.
func parseEquivalents(r io.Reader) ([]*equivalent, error) {
	var out []*equivalent
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "" || strings.HasPrefix(trimmed, "#"):
			continue
		case line[0] == ' ' || line[0] == '\t':
			if len(out) == 0 {
				return nil, fmt.Errorf("line %d: reason %q before any entry", n, trimmed)
			}
			e := out[len(out)-1]
			e.reason = strings.TrimSpace(e.reason + " " + trimmed)
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 {
			return nil, fmt.Errorf("line %d: want \"<file> <MUTATOR_TYPE> <source line>\", got %q", n, line)
		}
		e := &equivalent{file: fields[0], kind: fields[1], code: strings.Join(fields[2:], " "), at: n}
		if kind, nth, ok := strings.Cut(e.kind, "#"); ok {
			v, err := strconv.Atoi(nth)
			if err != nil || v < 1 {
				return nil, fmt.Errorf("line %d: %q: the N of TYPE#N must be a number from 1", n, e.kind)
			}
			e.kind, e.nth = kind, v
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read equivalent-mutant list: %w", err)
	}
	for _, e := range out {
		if e.reason == "" {
			return nil, fmt.Errorf("line %d: entry for %s %s says no reason (indent it on the lines below)", e.at, e.file, e.kind)
		}
	}
	return out, nil
}

// sourceLines caches files read to quote mutated lines.
type sourceLines map[string][]string

func (s sourceLines) line(root, file string, n int) (string, error) {
	lines, ok := s[file]
	if !ok {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			return "", fmt.Errorf("quote mutated line: %w", err)
		}
		lines = strings.Split(string(b), "\n")
		s[file] = lines
	}
	if n < 1 || n > len(lines) {
		return "", fmt.Errorf("quote mutated line: %s has no line %d", file, n)
	}
	return strings.Join(strings.Fields(lines[n-1]), " "), nil
}

// summarise counts one package's result and explains its survivors.
func summarise(dir string, res result, equivalents []*equivalent, src sourceLines, root string) (packageReport, error) {
	p := packageReport{dir: dir}
	for _, f := range res.Files {
		file := path.Join(dir, filepath.ToSlash(f.Filename))
		// The columns of each line's mutants of each kind, whatever their
		// status, number a mutant among its kind on its line.
		type lineKind struct {
			line int
			kind string
		}
		columns := map[lineKind][]int{}
		for _, m := range f.Mutations {
			k := lineKind{m.Line, m.Type}
			if !slices.Contains(columns[k], m.Column) {
				columns[k] = append(columns[k], m.Column)
			}
		}
		for _, cols := range columns {
			slices.Sort(cols)
		}
		for _, m := range f.Mutations {
			switch m.Status {
			case statusKilled:
				p.killed++
			case statusTimedOut:
				p.timedOut++
			case statusNotCovered:
				p.notCovered++
			case statusNotViable:
				p.notViable++
			case statusLived:
				p.lived++
				code, err := src.line(root, file, m.Line)
				if err != nil {
					return p, err
				}
				cols := columns[lineKind{m.Line, m.Type}]
				s := mutant{file: file, line: m.Line, column: m.Column, kind: m.Type, code: code,
					nth: slices.Index(cols, m.Column) + 1, of: len(cols)}
				for _, e := range equivalents {
					if e.matches(s) {
						s.reason = e.reason
						e.used = true
						p.explained++
						break
					}
				}
				p.survivors = append(p.survivors, s)
			}
		}
	}
	sort.Slice(p.survivors, func(i, j int) bool {
		a, b := p.survivors[i], p.survivors[j]
		if a.file != b.file {
			return a.file < b.file
		}
		if a.line != b.line {
			return a.line < b.line
		}
		return a.column < b.column
	})
	return p, nil
}

func percent(v float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", v)
}

// judged says which entries of the equivalent list a run can call stale:
// those of the files it mutated, and those of its packages' files that no
// longer exist. A run over the files changed since a commit
// (MUTATION_SINCE) leaves the rest of a package unmutated, and their
// entries unjudged.
type judged struct {
	files, pkgs map[string]bool
	root        string
}

func (j judged) canJudge(file string) bool {
	if j.files[file] {
		return true
	}
	if !j.pkgs[path.Dir(file)] {
		return false
	}
	_, err := os.Stat(filepath.Join(j.root, filepath.FromSlash(file)))
	return errors.Is(err, os.ErrNotExist)
}

func report(w io.Writer, pkgs []packageReport, equivalents []*equivalent, goal float64, measured judged) bool {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "package\tkilled\tlived\tequivalent\ttimed out\tnot covered\tefficacy\t(gremlins)\tmutator coverage\tgoal\tverdict\n")
	allMet := true
	for _, p := range pkgs {
		e, eok := p.efficacy()
		raw, rok := p.rawEfficacy()
		c, cok := p.coverage()
		verdict := "ok"
		switch {
		case p.noMutants():
			verdict = "no mutants"
		case !eok:
			verdict = "no covered mutant"
		case e < goal:
			verdict = "BELOW GOAL"
		case p.explained < len(p.survivors):
			verdict = fmt.Sprintf("%d unexplained", len(p.survivors)-p.explained)
		}
		if !p.meetsGoal(goal) {
			allMet = false
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%.0f%%\t%s\n",
			p.dir, p.killed, p.lived, p.explained, p.timedOut, p.notCovered, percent(e, eok), percent(raw, rok), percent(c, cok), goal, verdict)
	}
	tw.Flush()
	fmt.Fprintf(w, "efficacy = killed / (killed + lived - equivalent); (gremlins) counts the equivalent as lived.\n")

	for _, p := range pkgs {
		if len(p.survivors) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nsurvivors in %s (%d, %d listed as equivalent):\n", p.dir, len(p.survivors), p.explained)
		for _, s := range p.survivors {
			kind := s.kind
			if s.of > 1 {
				kind = fmt.Sprintf("%s#%d", s.kind, s.nth) // as an entry names it
			}
			fmt.Fprintf(w, "  %s:%d:%d %s\n      %s\n", s.file, s.line, s.column, kind, s.code)
			if s.reason != "" {
				fmt.Fprintf(w, "      equivalent: %s\n", s.reason)
			}
		}
	}

	var stale []*equivalent
	for _, e := range equivalents {
		if !e.used && measured.canJudge(e.file) {
			stale = append(stale, e)
		}
	}
	if len(stale) > 0 {
		fmt.Fprintf(w, "\nstale entries in the equivalent-mutant list (no such survivor now; remove them):\n")
		for _, e := range stale {
			kind := e.kind
			if e.nth > 0 {
				kind = fmt.Sprintf("%s#%d", e.kind, e.nth)
			}
			fmt.Fprintf(w, "  line %d: %s %s %s\n", e.at, e.file, kind, e.code)
		}
	}
	return allMet
}

func run(args []string, stdout io.Writer) (bool, error) {
	fs := flag.NewFlagSet("mutationreport", flag.ContinueOnError)
	goal := fs.Float64("goal", 90, "minimum test efficacy per package, in percent")
	equivalentPath := fs.String("equivalent", "", "equivalent-mutant list (optional)")
	root := fs.String("root", ".", "module root")
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	if fs.NArg() == 0 {
		return false, errors.New("no results given: want PKGDIR=RESULT.json arguments")
	}
	var equivalents []*equivalent
	if *equivalentPath != "" {
		f, err := os.Open(*equivalentPath)
		if err != nil {
			return false, fmt.Errorf("open equivalent-mutant list: %w", err)
		}
		equivalents, err = parseEquivalents(f)
		f.Close()
		if err != nil {
			return false, fmt.Errorf("%s: %w", *equivalentPath, err)
		}
	}
	src := sourceLines{}
	measured := judged{files: map[string]bool{}, pkgs: map[string]bool{}, root: *root}
	var pkgs []packageReport
	for _, arg := range fs.Args() {
		dir, file, ok := strings.Cut(arg, "=")
		if !ok || dir == "" || file == "" {
			return false, fmt.Errorf("argument %q: want PKGDIR=RESULT.json", arg)
		}
		dir = path.Clean(strings.TrimPrefix(filepath.ToSlash(dir), "./"))
		b, err := os.ReadFile(file)
		if err != nil {
			return false, fmt.Errorf("read gremlins result of %s: %w", dir, err)
		}
		var res result
		if err := json.Unmarshal(b, &res); err != nil {
			return false, fmt.Errorf("parse gremlins result %s: %w", file, err)
		}
		p, err := summarise(dir, res, equivalents, src, *root)
		if err != nil {
			return false, fmt.Errorf("%s: %w", dir, err)
		}
		measured.pkgs[dir] = true
		for _, f := range res.Files {
			measured.files[path.Join(dir, filepath.ToSlash(f.Filename))] = true
		}
		pkgs = append(pkgs, p)
	}
	return report(stdout, pkgs, equivalents, *goal, measured), nil
}

func main() {
	ok, err := run(os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutationreport:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}
