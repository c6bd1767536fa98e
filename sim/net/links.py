"""The directed links of a fabric: ids by tier, capacities, latencies, and routing of flows.

``Links(fabric, bandwidth_efficiency)`` lays every link of ``sim.net.fabric.Fabric`` out as an
integer id in flat numpy arrays, by tier: each GPU's scale-up port (up and down), host edges
(GPU or NIC side of PCIe), for PCIe cards each node's server links (``sim.net.server.server_tables``:
GPU slots, switch uplinks, socket link, host memory, NIC slots, bridges), NIC uplinks and
downlinks, switch-block uplinks per level, and the mesh/torus grid ports; ``tier`` says each
link's tier.  Inside a node of PCIe cards a flow follows the server's path table instead of the
two NVSwitch ports, and a cross-node flow reaches its NIC over the server's PCIe tree.  A flow's path is split into a sender-side piece (precomputed per GPU
and stripe), a fabric piece (computed per pair of NIC pools) and a receiver-side piece, so that
routing every flow of 10^4 GPUs is a few ``bincount``s.  ``sim.net.network.Network`` prices
collectives from these loads; the event engine's ``LinkTable`` shares the same ids.

Capacities are nominal bandwidth times the tier's collective efficiency.  A striped flow puts
``1/stripes`` of a flow on each stripe; parallel spine links are one pooled link (ideal ECMP).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from sim.net.fabric import TIERS, Fabric


class Links:
    """Link ids, capacities and flow routing of one fabric (module docstring)."""

    def __init__(self, fabric: Fabric, bandwidth_efficiency: Mapping[str, float]) -> None:
        self.fabric = fabric
        f, eff = fabric, bandwidth_efficiency
        G, gpn, nics = f.num_gpus, f.gpus_per_node, f.nics_per_node
        total_nics = f.num_nodes * nics
        H = G if f.gpu_per_nic_host_edge else total_nics
        srv = self.srv = f.server
        E_srv = srv.num_links if srv is not None else 0
        self.su_up, self.su_down = 0, G
        self.host_up, self.host_down = 2 * G, 2 * G + H
        self.srv_base, self.srv_links = 2 * G + 2 * H, E_srv  # PCIe servers: E_srv links per node
        self.nic_up = self.srv_base + f.num_nodes * E_srv
        self.nic_down = self.nic_up + total_nics
        base = self.nic_down + total_nics
        cap: list[np.ndarray] = []
        lat: list[np.ndarray] = []
        tiers: list[np.ndarray] = []

        def add(n: int, bytes_per_s: float | np.ndarray, latency_s: float | np.ndarray, t: int | np.ndarray) -> None:
            t = np.broadcast_to(np.asarray(t, dtype=np.int8), (n,))
            scale = np.array([eff[tier] for tier in TIERS])[t]
            cap.append(np.broadcast_to(np.asarray(bytes_per_s, dtype=float), (n,)) * scale)
            lat.append(np.broadcast_to(np.asarray(latency_s, dtype=float), (n,)))
            tiers.append(t)

        add(2 * G, f.scale_up_bytes_per_s, f.scale_up_latency_s / 2, 0)
        add(2 * H, f.host_bytes_per_s, 0.0, 1)
        if srv is not None:
            nodes = f.num_nodes
            add(nodes * E_srv, np.tile(srv.cap, nodes), np.tile(srv.lat, nodes), np.tile(srv.tier, nodes))
        add(2 * total_nics, f.nic_bytes_per_s, f.nic_latency_s / 2 if f.switched else 0.0, 2)
        self.blk_up: list[int] = []
        self.blk_down: list[int] = []
        for k in range(1, f.levels):
            up = f.block_up_bytes_per_s[k - 1]
            self.blk_up.append(base)
            self.blk_down.append(base + len(up))
            base += 2 * len(up)
            add(len(up), up, f.switch_latency_s, 2)
            add(len(up), up, f.switch_latency_s, 2)
        self.grid = base
        if not f.switched:
            rows, cols = f.grid_rows, f.grid_cols
            node = np.arange(f.num_nodes)
            x, y = node % cols, node // cols
            bw = np.zeros((f.num_nodes, 4))
            xb, yb = f.grid_link_bytes_per_s
            ok_plus_x = (x + 1 < cols) | (f.torus and cols > 1)
            ok_minus_x = (x > 0) | (f.torus and cols > 1)
            ok_plus_y = (y + 1 < rows) | (f.torus and rows > 1)
            ok_minus_y = (y > 0) | (f.torus and rows > 1)
            bw[:, 0], bw[:, 1] = np.where(ok_plus_x, xb, 0.0), np.where(ok_minus_x, xb, 0.0)
            bw[:, 2], bw[:, 3] = np.where(ok_plus_y, yb, 0.0), np.where(ok_minus_y, yb, 0.0)
            add(4 * f.num_nodes, bw.ravel(), f.nic_latency_s, 2)
            base += 4 * f.num_nodes
        self.num_links = base
        self.cap = np.concatenate(cap)
        self.lat = np.concatenate(lat)
        self.tier = np.concatenate(tiers)  # per link: index into sim.net.fabric.TIERS
        if srv is not None:
            self._server_sides()
            return

        # Sender / receiver pieces of a cross-domain flow, per GPU and stripe (3 links at most).
        gpus = np.arange(G)
        m = f.stripes
        a = f.pool_nics[f.gpu_pool]  # (G, m) NIC of each stripe
        owner = f.nic_owner[a]
        attached = owner == gpus[:, None] if not f.gpu_per_nic_host_edge else \
            (a == (gpus // gpn * nics + np.array([f.gpu_nics[l][0] for l in range(gpn)])[gpus % gpn])[:, None])
        pair_self = gpus[:, None] if f.gpu_per_nic_host_edge else a
        pair_owner = owner if f.gpu_per_nic_host_edge else a
        out = np.full((G, m, 3), -1, dtype=np.int64)
        inn = np.full((G, m, 3), -1, dtype=np.int64)
        gg = np.broadcast_to(gpus[:, None], (G, m))
        out[..., 0] = np.where(attached, self.host_up + pair_self, self.su_up + gg)
        out[..., 1] = np.where(attached, -1, self.su_down + owner)
        out[..., 2] = np.where(attached, -1, self.host_up + pair_owner)
        inn[..., 0] = np.where(attached, self.host_down + pair_self, self.host_down + pair_owner)
        inn[..., 1] = np.where(attached, -1, self.su_up + owner)
        inn[..., 2] = np.where(attached, -1, self.su_down + gg)
        self.out_path, self.in_path = out, inn
        self.out_lat_j = self.path_latency(out)  # (G, stripes)
        self.in_lat_j = self.path_latency(inn)
        self.out_lat = self.out_lat_j.max(axis=1)
        self.in_lat = self.in_lat_j.max(axis=1)

    def _server_sides(self) -> None:
        """Sender / receiver pieces of cross-node flows on a PCIe server: GPU -> its stripe's NIC
        port and NIC -> GPU over the node's PCIe tree (``sim.net.server`` paths, per node)."""
        f, srv = self.fabric, self.srv
        G, gpn, nics = f.num_gpus, f.gpus_per_node, f.nics_per_node
        gpus = np.arange(G)
        a = f.pool_nics[f.gpu_pool]  # (G, m) NIC of each stripe
        local, k = gpus % gpn, a % nics
        offset = (self.srv_base + (gpus // gpn) * self.srv_links)[:, None, None]
        out = srv.gn[local[:, None], k]  # (G, m, L)
        inn = srv.ng[local[:, None], k]
        self.out_path = np.where(out >= 0, out + offset, -1)
        self.in_path = np.where(inn >= 0, inn + offset, -1)
        self.out_lat_j = self.path_latency(self.out_path)
        self.in_lat_j = self.path_latency(self.in_path)
        self.out_lat = self.out_lat_j.max(axis=1)
        self.in_lat = self.in_lat_j.max(axis=1)

    def same_paths(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Link ids ``(flows, L)`` (-1 padded) of flows inside one node of a PCIe server."""
        gpn = self.fabric.gpus_per_node
        p = self.srv.gg[src % gpn, dst % gpn]
        return np.where(p >= 0, p + (self.srv_base + (src // gpn) * self.srv_links)[:, None], -1)

    def gpu_slot_links(self, gpu: int) -> np.ndarray:
        """A GPU's own links: its NVLink ports, or on a PCIe server its slot (up and down)."""
        if self.srv is None:
            return np.array([self.su_up + gpu, self.su_down + gpu], dtype=np.int64)
        gpn = self.fabric.gpus_per_node
        return self.srv.gpu_links[gpu % gpn] + self.srv_base + (gpu // gpn) * self.srv_links

    def label(self, link: int) -> str:
        """What link id ``link`` is, in words (bottleneck reports)."""
        f = self.fabric
        if link < self.host_up:
            return f"gpu{link % f.num_gpus} scale-up port {'out' if link < self.su_down else 'in'}"
        if link < self.srv_base:
            return f"host edge {(link - self.host_up) % (self.host_down - self.host_up or 1)}"
        if link < self.nic_up:
            node, local = divmod(link - self.srv_base, self.srv_links)
            return f"node{node} {self.srv.label[local]}"
        if link < self.nic_down + f.num_nodes * f.nics_per_node:
            up = link < self.nic_down
            return f"nic{link - (self.nic_up if up else self.nic_down)} {'uplink' if up else 'downlink'}"
        for k, (u, d) in enumerate(zip(self.blk_up, self.blk_down)):
            if u <= link < d + (d - u):
                return f"level-{k + 1} block {(link - u) % (d - u)} {'uplink' if link < d else 'downlink'}"
        return f"grid link {link - self.grid}"

    def path_latency(self, paths: np.ndarray) -> np.ndarray:
        return np.where(paths >= 0, self.lat[np.maximum(paths, 0)], 0.0).sum(axis=-1)

    def fabric_paths(self, pool_src: np.ndarray, pool_dst: np.ndarray) -> np.ndarray:
        """Link ids ``(pairs, stripes, L)`` (-1 padded) from NIC pool to NIC pool."""
        f = self.fabric
        a = f.pool_nics[pool_src]
        b = f.pool_nics[pool_dst]
        same = a == b
        cols = [np.where(same, -1, self.nic_up + a)]
        if f.switched:
            downs = []
            for k in range(1, f.levels):
                ba, bb = f.block_of[k - 1][a], f.block_of[k - 1][b]
                cross = (ba != bb) & ~same
                cols.append(np.where(cross, self.blk_up[k - 1] + ba, -1))
                downs.append(np.where(cross, self.blk_down[k - 1] + bb, -1))
            cols += downs[::-1]
        else:
            cols += self.grid_hops(a // f.nics_per_node, b // f.nics_per_node, same)
        cols.append(np.where(same, -1, self.nic_down + b))
        return np.stack(cols, axis=-1)

    def grid_hops(self, na: np.ndarray, nb: np.ndarray, same: np.ndarray) -> list[np.ndarray]:
        f = self.fabric
        rows, cols = f.grid_rows, f.grid_cols
        xa, ya, xb, yb = na % cols, na // cols, nb % cols, nb // cols
        out: list[np.ndarray] = []
        for size, cur, goal, fixed, axis in ((cols, xa, xb, ya, 0), (rows, ya, yb, xb, 1)):
            if size == 1:
                continue
            if f.torus:
                fwd = (goal - cur) % size
                plus = fwd <= size - fwd
                count = np.where(plus, fwd, size - fwd)
            else:
                plus = goal >= cur
                count = np.abs(goal - cur)
            step = np.where(plus, 1, -1)
            direction = 2 * axis + np.where(plus, 0, 1)
            for i in range(int(count.max(initial=0))):
                pos = (cur + step * i) % size
                node = fixed * cols + pos if axis == 0 else pos * cols + fixed
                out.append(np.where((i < count) & ~same, self.grid + 4 * node + direction, -1))
        return out

    def link_loads(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Load on every directed link (array indexed by link id) when all flows
        ``src[k] -> dst[k]`` run at once; a striped flow puts ``1/stripes`` on each stripe."""
        return self.route(np.asarray(src, dtype=np.int64).ravel(), np.asarray(dst, dtype=np.int64).ravel())[0]

    def route(self, src: np.ndarray, dst: np.ndarray) -> tuple:
        """Route every flow: ``(loads, same, fabric_inverse, fabric_paths, fabric_valid)``."""
        f = self.fabric
        E = self.num_links
        m = f.stripes
        if f.has_scale_up:
            same = f.gpu_domain[src] == f.gpu_domain[dst]
        else:
            same = np.zeros(len(src), dtype=bool)
        loads = np.zeros(E)
        ss, sd = src[same], dst[same]
        if ss.size and self.srv is not None:
            p = self.same_paths(ss, sd)
            loads += np.bincount(p[p >= 0], minlength=E)
        elif ss.size:
            loads += np.bincount(ss + self.su_up, minlength=E)
            loads += np.bincount(sd + self.su_down, minlength=E)
        xs, xd = src[~same], dst[~same]
        inv = fpath = valid = None
        if xs.size:
            G = f.num_gpus
            for counts, paths in ((np.bincount(xs, minlength=G), self.out_path),
                                  (np.bincount(xd, minlength=G), self.in_path)):
                used = np.nonzero(counts)[0]
                p = paths[used]
                w = np.broadcast_to((counts[used] / m)[:, None, None], p.shape)
                ok = p >= 0
                loads += np.bincount(p[ok], weights=w[ok], minlength=E)
            pools = f.num_pools
            key = f.gpu_pool[xs] * pools + f.gpu_pool[xd]
            ukey, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
            fpath = self.fabric_paths(ukey // pools, ukey % pools)
            valid = fpath >= 0
            w = np.broadcast_to((cnt / m)[:, None, None], fpath.shape)
            loads += np.bincount(fpath[valid], weights=w[valid], minlength=E)
        return loads, same, inv, fpath, valid

    def piece_rate(self, share: np.ndarray, paths: np.ndarray) -> np.ndarray:
        return np.where(paths >= 0, share[np.maximum(paths, 0)], np.inf).min(axis=(-1, -2))

    def share(self, loads: np.ndarray) -> np.ndarray:
        """Per-link rate each unit of load gets: ``capacity * efficiency / load``."""
        busy = loads > 0
        return np.where(busy, self.cap / np.where(busy, loads, 1.0), np.inf)

    def side_loads(self, loads: np.ndarray, counts: np.ndarray) -> None:
        """Add the sender- and receiver-side pieces of ``counts[gpu]`` cross-domain flows."""
        m = self.fabric.stripes
        for paths in (self.out_path, self.in_path):
            used = np.nonzero(counts)[0]
            p = paths[used]
            w = np.broadcast_to((counts[used] / m)[:, None, None], p.shape)
            valid = p >= 0
            loads += np.bincount(p[valid], weights=w[valid], minlength=self.num_links)
