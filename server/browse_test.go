package server

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
)

// hierarchical is a BrowseDescription of node's forward hierarchical
// references with every field, as a load generator sends it.
func hierarchical(node *ua.NodeID) *ua.BrowseDescription {
	return &ua.BrowseDescription{
		NodeID: node, BrowseDirection: ua.BrowseDirectionForward,
		ReferenceTypeID: ua.NewNumericNodeID(0, id.HierarchicalReferences), IncludeSubtypes: true,
		ResultMask: uint32(ua.BrowseResultMaskAll),
	}
}

func browseRequest(nodes ...*ua.BrowseDescription) *ua.BrowseRequest {
	return &ua.BrowseRequest{View: &ua.ViewDescription{ViewID: ua.NewTwoByteNodeID(0)}, NodesToBrowse: nodes}
}

// browse sends a Browse and returns its results; it fails the test on a
// service error or a result count other than the request's.
func browse(t *testing.T, c *opcua.Client, req *ua.BrowseRequest) []*ua.BrowseResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Browse(ctx, req)
	if err != nil {
		t.Fatalf("browse: %v", err)
	}
	if len(resp.Results) != len(req.NodesToBrowse) {
		t.Fatalf("browse: %d results for %d nodes", len(resp.Results), len(req.NodesToBrowse))
	}
	return resp.Results
}

// browseOne browses one node and requires a Good result.
func browseOne(t *testing.T, c *opcua.Client, d *ua.BrowseDescription) []*ua.ReferenceDescription {
	t.Helper()
	res := browse(t, c, browseRequest(d))[0]
	if res.StatusCode != ua.StatusOK {
		t.Fatalf("browse %v: status %v", d.NodeID, res.StatusCode)
	}
	if len(res.ContinuationPoint) != 0 {
		t.Errorf("browse %v: continuation point %x", d.NodeID, res.ContinuationPoint)
	}
	return res.References
}

// targets are the target NodeIds of refs, as strings.
func targets(refs []*ua.ReferenceDescription) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.NodeID.NodeID.String())
	}
	return out
}

func numeric(ids ...uint32) []string {
	var out []string
	for _, i := range ids {
		out = append(out, ua.NewNumericNodeID(0, i).String())
	}
	return out
}

func TestBrowseHierarchy(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint))

	root := browseOne(t, c, hierarchical(ua.NewNumericNodeID(0, id.RootFolder)))
	if got, want := targets(root), numeric(id.ObjectsFolder, id.TypesFolder, id.ViewsFolder); !slices.Equal(got, want) {
		t.Fatalf("Root: %v, want %v", got, want)
	}
	for i, name := range []string{"Objects", "Types", "Views"} {
		r := root[i]
		if r.ReferenceTypeID.IntID() != id.Organizes || !r.IsForward || r.NodeClass != ua.NodeClassObject ||
			r.BrowseName.Name != name || r.BrowseName.NamespaceIndex != 0 || r.DisplayName.Text != name ||
			r.TypeDefinition.NodeID.IntID() != id.FolderType {
			t.Errorf("Root → %s: %+v", name, r)
		}
	}

	objects := browseOne(t, c, hierarchical(ua.NewNumericNodeID(0, id.ObjectsFolder)))
	if got, want := targets(objects), []string{ua.NewNumericNodeID(0, id.Server).String(), "ns=1;s=" + FolderNode}; !slices.Equal(got, want) {
		t.Fatalf("Objects: %v, want %v", got, want)
	}
	if r := objects[0]; r.BrowseName.Name != "Server" || r.TypeDefinition.NodeID.IntID() != id.ServerType || r.ReferenceTypeID.IntID() != id.Organizes {
		t.Errorf("Objects → Server: %+v", r)
	}
	if r := objects[1]; r.BrowseName.Name != FolderNode || r.BrowseName.NamespaceIndex != 1 || r.NodeClass != ua.NodeClassObject {
		t.Errorf("Objects → %s: %+v", FolderNode, r)
	}

	server := browseOne(t, c, hierarchical(ua.NewNumericNodeID(0, id.Server)))
	want := numeric(id.Server_ServerArray, id.Server_NamespaceArray, id.Server_ServerStatus, id.Server_ServerCapabilities, id.Server_ServerDiagnostics)
	if got := targets(server); !slices.Equal(got, want) {
		t.Fatalf("Server: %v, want %v", got, want)
	}
	byName := map[string]*ua.ReferenceDescription{}
	for _, r := range server {
		byName[r.BrowseName.Name] = r
	}
	if r := byName["NamespaceArray"]; r == nil || r.ReferenceTypeID.IntID() != id.HasProperty || r.NodeClass != ua.NodeClassVariable || r.TypeDefinition.NodeID.IntID() != id.PropertyType {
		t.Errorf("Server → NamespaceArray: %+v", r)
	}
	if r := byName["ServerStatus"]; r == nil || r.ReferenceTypeID.IntID() != id.HasComponent || r.TypeDefinition.NodeID.IntID() != id.ServerStatusType {
		t.Errorf("Server → ServerStatus: %+v", r)
	}

	status := browseOne(t, c, hierarchical(ua.NewNumericNodeID(0, id.Server_ServerStatus)))
	want = numeric(id.Server_ServerStatus_StartTime, id.Server_ServerStatus_CurrentTime, id.Server_ServerStatus_State,
		id.Server_ServerStatus_BuildInfo, id.Server_ServerStatus_SecondsTillShutdown, id.Server_ServerStatus_ShutdownReason)
	if got := targets(status); !slices.Equal(got, want) {
		t.Errorf("ServerStatus: %v, want %v", got, want)
	}
	if len(status) > 0 && status[0].BrowseName.Name != "StartTime" {
		t.Errorf("ServerStatus → %+v, want StartTime", status[0])
	}
	// Types and Views have no children here.
	if refs := browseOne(t, c, hierarchical(ua.NewNumericNodeID(0, id.TypesFolder))); len(refs) != 0 {
		t.Errorf("Types: %v", targets(refs))
	}
}

// TestBrowseWalkReadsGood walks the whole hierarchy from Root (a node id
// given as four-byte too) and reads every Variable it reaches: each one is
// served by Read, and every node but Root is reached exactly once.
func TestBrowseWalkReadsGood(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint))

	seen := map[string]bool{}
	var variables []*ua.NodeID
	next := []*ua.NodeID{ua.NewFourByteNodeID(0, id.RootFolder)}
	for len(next) > 0 {
		var req []*ua.BrowseDescription
		for _, n := range next {
			req = append(req, hierarchical(n))
		}
		next = nil
		for i, res := range browse(t, c, browseRequest(req...)) {
			if res.StatusCode != ua.StatusOK {
				t.Fatalf("browse %v: %v", req[i].NodeID, res.StatusCode)
			}
			for _, r := range res.References {
				n := r.NodeID.NodeID
				if seen[n.String()] {
					t.Errorf("%v reached twice", n)
				}
				seen[n.String()] = true
				next = append(next, n)
				if r.NodeClass == ua.NodeClassVariable {
					variables = append(variables, n)
				}
			}
		}
	}
	if len(variables) < 50 {
		t.Fatalf("%d variables reached, want the standard ones and the %s folder's", len(variables), FolderNode)
	}
	for i, dv := range readValues(t, c, variables...) {
		if dv.Status != ua.StatusOK {
			t.Errorf("read %v: %v", variables[i], dv.Status)
		}
	}
}

func TestBrowseFilters(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint))
	server := ua.NewNumericNodeID(0, id.Server)
	status := ua.NewNumericNodeID(0, id.Server_ServerStatus)
	with := func(n *ua.NodeID, f func(d *ua.BrowseDescription)) *ua.BrowseDescription {
		d := hierarchical(n)
		f(d)
		return d
	}
	ref := func(typ uint32) *ua.NodeID { return ua.NewNumericNodeID(0, typ) }

	tests := []struct {
		name string
		d    *ua.BrowseDescription
		want []string
	}{
		{"inverse", with(status, func(d *ua.BrowseDescription) { d.BrowseDirection = ua.BrowseDirectionInverse }),
			numeric(id.Server)},
		{"both", with(server, func(d *ua.BrowseDescription) { d.BrowseDirection = ua.BrowseDirectionBoth }),
			numeric(id.Server_ServerArray, id.Server_NamespaceArray, id.Server_ServerStatus, id.Server_ServerCapabilities, id.Server_ServerDiagnostics, id.ObjectsFolder)},
		{"root has no inverse", with(ua.NewNumericNodeID(0, id.RootFolder), func(d *ua.BrowseDescription) { d.BrowseDirection = ua.BrowseDirectionInverse }),
			nil},
		{"variables only", with(server, func(d *ua.BrowseDescription) { d.NodeClassMask = uint32(ua.NodeClassVariable) }),
			numeric(id.Server_ServerArray, id.Server_NamespaceArray, id.Server_ServerStatus)},
		{"objects only", with(server, func(d *ua.BrowseDescription) { d.NodeClassMask = uint32(ua.NodeClassObject) }),
			numeric(id.Server_ServerCapabilities, id.Server_ServerDiagnostics)},
		{"methods only", with(server, func(d *ua.BrowseDescription) { d.NodeClassMask = uint32(ua.NodeClassMethod) }),
			nil},
		{"HasProperty exactly", with(server, func(d *ua.BrowseDescription) { d.ReferenceTypeID, d.IncludeSubtypes = ref(id.HasProperty), false }),
			numeric(id.Server_ServerArray, id.Server_NamespaceArray)},
		{"HasChild and subtypes", with(server, func(d *ua.BrowseDescription) { d.ReferenceTypeID = ref(id.HasChild) }),
			numeric(id.Server_ServerArray, id.Server_NamespaceArray, id.Server_ServerStatus, id.Server_ServerCapabilities, id.Server_ServerDiagnostics)},
		{"HasChild exactly", with(server, func(d *ua.BrowseDescription) { d.ReferenceTypeID, d.IncludeSubtypes = ref(id.HasChild), false }),
			nil},
		{"Organizes", with(server, func(d *ua.BrowseDescription) { d.ReferenceTypeID = ref(id.Organizes) }),
			nil},
		{"References and subtypes", with(ua.NewNumericNodeID(0, id.RootFolder), func(d *ua.BrowseDescription) { d.ReferenceTypeID = ref(id.References) }),
			numeric(id.ObjectsFolder, id.TypesFolder, id.ViewsFolder)},
		{"null reference type", with(ua.NewNumericNodeID(0, id.RootFolder), func(d *ua.BrowseDescription) { d.ReferenceTypeID, d.IncludeSubtypes = ua.NewTwoByteNodeID(0), false }),
			numeric(id.ObjectsFolder, id.TypesFolder, id.ViewsFolder)},
		{"unknown reference type", with(server, func(d *ua.BrowseDescription) { d.ReferenceTypeID = ref(id.HasTypeDefinition) }),
			nil},
	}
	for _, tt := range tests {
		if got := targets(browseOne(t, c, tt.d)); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}

	// The inverse reference says so.
	inv := browseOne(t, c, tests[0].d)
	if r := inv[0]; r.IsForward || r.ReferenceTypeID.IntID() != id.HasComponent || r.BrowseName.Name != "Server" || r.NodeClass != ua.NodeClassObject {
		t.Errorf("inverse: %+v", r)
	}

	// ResultMask None: the target NodeId only, the rest zero.
	refs := browseOne(t, c, with(server, func(d *ua.BrowseDescription) { d.ResultMask = 0 }))
	for _, r := range refs {
		if r.NodeID == nil || r.NodeID.NodeID.IntID() == 0 || r.ReferenceTypeID.IntID() != 0 || r.IsForward || r.NodeClass != 0 ||
			r.BrowseName.Name != "" || r.DisplayName.Text != "" || r.TypeDefinition.NodeID.IntID() != 0 {
			t.Errorf("ResultMask 0: %+v", r)
		}
	}
	// BrowseName and IsForward only.
	refs = browseOne(t, c, with(server, func(d *ua.BrowseDescription) {
		d.ResultMask = uint32(ua.BrowseResultMaskBrowseName | ua.BrowseResultMaskIsForward)
	}))
	for _, r := range refs {
		if r.BrowseName.Name == "" || !r.IsForward || r.ReferenceTypeID.IntID() != 0 || r.NodeClass != 0 || r.DisplayName.Text != "" {
			t.Errorf("ResultMask BrowseName|IsForward: %+v", r)
		}
	}

	// RequestedMaxReferencesPerNode caps each result; no continuation point.
	req := browseRequest(hierarchical(server), hierarchical(ua.NewNumericNodeID(0, id.RootFolder)), hierarchical(status))
	req.RequestedMaxReferencesPerNode = 2
	for i, res := range browse(t, c, req) {
		if res.StatusCode != ua.StatusOK || len(res.References) != 2 || len(res.ContinuationPoint) != 0 {
			t.Errorf("capped result %d: %v, %d references, continuation point %x", i, res.StatusCode, len(res.References), res.ContinuationPoint)
		}
	}
	if res := browse(t, c, req)[0]; len(res.References) == 2 && targets(res.References)[1] != numeric(id.Server_NamespaceArray)[0] {
		t.Errorf("capped: %v, want the first two", targets(res.References))
	}
}

func TestBrowseErrors(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint))

	// Per-node errors; the good node in between is served.
	bad := hierarchical(ua.NewNumericNodeID(0, id.Server))
	bad.BrowseDirection = ua.BrowseDirectionInvalid
	badRef := hierarchical(ua.NewNumericNodeID(0, id.Server))
	badRef.ReferenceTypeID = ua.NewStringNodeID(1, "Organizes")
	res := browse(t, c, browseRequest(
		hierarchical(ua.NewNumericNodeID(0, 12345)),
		hierarchical(ua.NewStringNodeID(1, "no such node")),
		hierarchical(ua.NewNumericNodeID(2, id.Server)),
		hierarchical(ua.NewNumericNodeID(0, id.ObjectsFolder)),
		bad, badRef,
	))
	want := []ua.StatusCode{ua.StatusBadNodeIDUnknown, ua.StatusBadNodeIDUnknown, ua.StatusBadNodeIDUnknown, ua.StatusOK,
		ua.StatusBadBrowseDirectionInvalid, ua.StatusBadReferenceTypeIDInvalid}
	for i, r := range res {
		if r.StatusCode != want[i] {
			t.Errorf("result %d: %v, want %v", i, r.StatusCode, want[i])
		}
		if r.StatusCode != ua.StatusOK && len(r.References) != 0 {
			t.Errorf("result %d: %v with references %v", i, r.StatusCode, targets(r.References))
		}
	}
	if len(res[3].References) != 2 {
		t.Errorf("Objects among bad nodes: %v", targets(res[3].References))
	}

	// Service faults.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Browse(ctx, browseRequest()); !errors.Is(err, ua.StatusBadNothingToDo) {
		t.Errorf("nothing to browse: err = %v, want BadNothingToDo", err)
	}
	many := make([]*ua.BrowseDescription, MaxNodesPerBrowse+1)
	for i := range many {
		many[i] = hierarchical(ua.NewNumericNodeID(0, id.Server))
	}
	if _, err := c.Browse(ctx, browseRequest(many...)); !errors.Is(err, ua.StatusBadTooManyOperations) {
		t.Errorf("%d nodes: err = %v, want BadTooManyOperations", len(many), err)
	}
	// MaxNodesPerBrowse is served (a reference each: the response of five
	// each is above gopcua's 2 MiB).
	most := browseRequest(many[1:]...)
	most.RequestedMaxReferencesPerNode = 1
	if res := browse(t, c, most); res[len(res)-1].StatusCode != ua.StatusOK || len(res[0].References) != 1 {
		t.Errorf("%d nodes: last %v, first %d references", len(many)-1, res[len(res)-1].StatusCode, len(res[0].References))
	}
	view := browseRequest(hierarchical(ua.NewNumericNodeID(0, id.Server)))
	view.View.ViewID = ua.NewNumericNodeID(0, id.ViewsFolder)
	if _, err := c.Browse(ctx, view); !errors.Is(err, ua.StatusBadViewIDUnknown) {
		t.Errorf("a view: err = %v, want BadViewIdUnknown", err)
	}
	// Without a session, like Read.
	if _, err := sendRaw(t, c, browseRequest(hierarchical(ua.NewNumericNodeID(0, id.Server))), nil); !errors.Is(err, ua.StatusBadSessionIDInvalid) {
		t.Errorf("no session: err = %v, want BadSessionIdInvalid", err)
	}
}

// asyncBrowse starts a Browse of the Server object and returns a channel
// with its error.
func asyncBrowse(c *opcua.Client) <-chan error {
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Browse(ctx, browseRequest(hierarchical(ua.NewNumericNodeID(0, id.Server))))
		errc <- err
	}()
	return errc
}

// TestBrowseQueuedLikeRead: a Browse waits in the fair queue behind a busy
// worker, counts against its owner's ceiling (BadServerTooBusy beyond it),
// and a queued one is cancelled by Cancel.
func TestBrowseQueuedLikeRead(t *testing.T) {
	endpoint, srv := startServer(t, Config{Workers: 1, QueueSize: 4, OwnerQueueSize: 2})
	c := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))

	running := occupyWorker(t, srv, c, 3000)
	queued := asyncBrowse(c)
	waitFor(t, "a queued browse", func() bool { return len(queuedHandles(srv)) == 1 })
	handle := queuedHandles(srv)[0]
	var cancelResp *ua.CancelResponse
	err := c.Send(context.Background(), &ua.CancelRequest{RequestHandle: handle}, func(r ua.Response) error {
		cancelResp, _ = r.(*ua.CancelResponse)
		return nil
	})
	if err != nil || cancelResp == nil || cancelResp.CancelCount != 1 {
		t.Fatalf("Cancel: %v %+v", err, cancelResp)
	}
	if err := waitErr(t, queued, "cancelled browse"); !errors.Is(err, ua.StatusBadRequestCancelledByClient) {
		t.Errorf("cancelled browse: err = %v, want BadRequestCancelledByClient", err)
	}

	admitted := []<-chan error{asyncBrowse(c), asyncBrowse(c)}
	waitFor(t, "2 queued", func() bool { return srv.queue.Stats().Queued == 2 })
	if err := waitErr(t, asyncBrowse(c), "over ceiling"); !errors.Is(err, StatusBadServerTooBusy) {
		t.Errorf("over the owner ceiling: err = %v, want BadServerTooBusy", err)
	}
	for _, errc := range append(admitted, running) {
		if err := waitErr(t, errc, "admitted request"); err != nil {
			t.Errorf("admitted request: %v", err)
		}
	}
	if o, _ := srv.queue.Owner("user1"); o.Cancelled != 1 || o.Rejected != 1 || o.Charged != 0 || o.Enqueued != o.Dispatched+o.Cancelled {
		t.Errorf("owner user1: %+v", o)
	}
	if st := srv.queue.Stats(); st.Charged != 0 {
		t.Errorf("queue slots held = %d, want 0", st.Charged)
	}
}

// BenchmarkBrowseServer is the worker's cost of browsing the Server
// object (five references, every field) and encoding the response.
func BenchmarkBrowseServer(b *testing.B) {
	s := &Server{}
	req := browseRequest(hierarchical(ua.NewNumericNodeID(0, id.Server)))
	req.RequestHeader = rawHeader(1)
	b.ReportAllocs()
	for range b.N {
		resp := s.browse(context.Background(), req)
		if _, err := ua.Encode(resp); err != nil {
			b.Fatal(err)
		}
	}
}
