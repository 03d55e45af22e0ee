package selection

import (
	"strings"
	"testing"

	"github.com/openeuler/urma-k8s/pkg/urma"
)

var (
	udma0 = Candidate{Name: "udma0", Driver: "udma", Transport: urma.TransportUB}
	udma1 = Candidate{Name: "udma1", Driver: "udma", Transport: urma.TransportUB}
	hns0  = Candidate{Name: "hns_ub0", Driver: "hns3_udma", Transport: urma.TransportHNSUB}
	bond0 = Candidate{Name: "bonding_dev_0", Driver: "ubagg", Transport: urma.TransportUB, Bonding: true}
	// broken has an unreadable device/ link, so sysfs calls it bonding.
	broken  = Candidate{Name: "udma2", Driver: "udma", Transport: urma.TransportUB, Bonding: true, Broken: true}
	ipdev   = Candidate{Name: "ipdev0", Driver: "udma", Transport: urma.TransportIP}
	allCand = []Candidate{udma0, udma1, hns0, ipdev}
)

func selectedNames(ds []Decision) []string {
	var out []string
	for _, d := range ds {
		if d.Selected {
			out = append(out, d.Name)
		}
	}
	return out
}

func TestSelect(t *testing.T) {
	tests := []struct {
		name   string
		policy Policy
		cands  []Candidate
		want   []string
	}{
		{"zero policy selects all", Policy{}, allCand, []string{"udma0", "udma1", "hns_ub0", "ipdev0"}},
		{"include glob", Policy{Include: []string{"udma*"}}, allCand, []string{"udma0", "udma1"}},
		{"exclude wins over include", Policy{Include: []string{"udma*"}, Exclude: []string{"udma1"}}, allCand, []string{"udma0"}},
		{"driver", Policy{Drivers: []string{"hns3_udma"}}, allCand, []string{"hns_ub0"}},
		{"transport", Policy{Transports: []urma.TransportType{urma.TransportUB, urma.TransportHNSUB}}, allCand, []string{"udma0", "udma1", "hns_ub0"}},
		{"auto with bonding: only bonding", Policy{}, []Candidate{udma0, bond0, udma1}, []string{"bonding_dev_0"}},
		{"auto, broken bonding hides nothing", Policy{}, []Candidate{udma0, broken, udma1}, []string{"udma0", "udma2", "udma1"}},
		{"auto, broken and healthy bonding: only bonding", Policy{}, []Candidate{udma0, broken, bond0}, []string{"udma2", "bonding_dev_0"}},
		{"auto, bonding excluded: members", Policy{Exclude: []string{"bonding*"}}, []Candidate{udma0, bond0, udma1}, []string{"udma0", "udma1"}},
		{"only without bonding: nothing", Policy{Bonding: BondingOnly}, allCand, nil},
		{"never", Policy{Bonding: BondingNever}, []Candidate{udma0, bond0}, []string{"udma0"}},
		{"all counts twice", Policy{Bonding: BondingAll}, []Candidate{udma0, bond0}, []string{"udma0", "bonding_dev_0"}},
		{"no candidates", Policy{}, nil, nil},
		{"character class", Policy{Include: []string{"udma[1-9]"}}, allCand, []string{"udma1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds := tt.policy.Select(tt.cands)
			if len(ds) != len(tt.cands) {
				t.Fatalf("got %d decisions for %d candidates", len(ds), len(tt.cands))
			}
			got := selectedNames(ds)
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("selected %v, want %v", got, tt.want)
			}
			for i, d := range ds {
				if d.Name != tt.cands[i].Name {
					t.Errorf("decision %d is for %q, want %q (order kept)", i, d.Name, tt.cands[i].Name)
				}
				if d.Selected == (d.Why != "") {
					t.Errorf("%s: Selected=%v with Why=%q", d.Name, d.Selected, d.Why)
				}
			}
		})
	}
}

// A bonding device selected before that is missing or unreadable now keeps
// its members hidden under auto; the other policies do not look at it.
func TestSelectRememberingBondingAway(t *testing.T) {
	tests := []struct {
		name   string
		policy Policy
		cands  []Candidate
		away   bool
		want   []string
		why    string // the first member's reason, when it is hidden
	}{
		{"auto, bonding away: members hidden", Policy{}, []Candidate{udma0, udma1}, true, nil, "missing or unreadable"},
		{"auto, bonding away and broken: broken one kept", Policy{}, []Candidate{udma0, broken, udma1}, true, []string{"udma2"}, "missing or unreadable"},
		{"auto, nothing away: members", Policy{}, []Candidate{udma0, udma1}, false, []string{"udma0", "udma1"}, ""},
		{"auto, another bonding device present", Policy{}, []Candidate{udma0, bond0}, true, []string{"bonding_dev_0"}, "a bonding device exists"},
		{"all ignores it", Policy{Bonding: BondingAll}, []Candidate{udma0, udma1}, true, []string{"udma0", "udma1"}, ""},
		{"never ignores it", Policy{Bonding: BondingNever}, []Candidate{udma0, udma1}, true, []string{"udma0", "udma1"}, ""},
		{"filters still apply", Policy{Exclude: []string{"udma1"}}, []Candidate{udma1}, true, nil, "exclude pattern"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds := tt.policy.SelectRemembering(tt.cands, tt.away)
			if got := selectedNames(ds); strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("selected %v, want %v", got, tt.want)
			}
			if tt.why != "" && !strings.Contains(ds[0].Why, tt.why) {
				t.Errorf("%s: reason %q, want it to say %q", ds[0].Name, ds[0].Why, tt.why)
			}
			// Select is SelectRemembering with nothing away.
			if got, want := selectedNames(tt.policy.Select(tt.cands)), selectedNames(tt.policy.SelectRemembering(tt.cands, false)); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("Select %v, SelectRemembering(false) %v", got, want)
			}
		})
	}
}

func TestWhyNamesTheRule(t *testing.T) {
	ds := Policy{Exclude: []string{"udma1"}}.Select([]Candidate{udma1, udma0, bond0})
	if !strings.Contains(ds[0].Why, `exclude pattern "udma1"`) {
		t.Errorf("exclude reason = %q", ds[0].Why)
	}
	if !strings.Contains(ds[1].Why, "bonding") {
		t.Errorf("bonding member reason = %q", ds[1].Why)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		p       Policy
		wantErr string
	}{
		{"ok", Policy{Include: []string{"udma*"}, Bonding: BondingNever}, ""},
		{"bad include", Policy{Include: []string{"udma["}}, `"udma["`},
		{"bad exclude", Policy{Exclude: []string{"[-"}}, `"[-"`},
		{"bad bonding", Policy{Bonding: "sometimes"}, `"sometimes"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want error containing %s", err, tt.wantErr)
			}
		})
	}
}

func TestParseTransport(t *testing.T) {
	tests := []struct {
		in      string
		want    urma.TransportType
		wantErr bool
	}{
		{"UB", urma.TransportUB, false},
		{"hns_ub", urma.TransportHNSUB, false},
		{" ip ", urma.TransportIP, false},
		{"0", urma.TransportType(0), false},
		{"1", urma.TransportIB, false},
		{"7", urma.TransportType(7), false},
		{"roce", 0, true},
		{"-1", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseTransport(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("ParseTransport(%q) = %v, %v; want %v, err=%v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
