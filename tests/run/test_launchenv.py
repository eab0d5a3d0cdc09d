"""minips launch's reading of the launchers' variables (minips/run/launchenv.py), with the
environments torchrun, srun, mpirun and the DMLC scripts set; the real torchrun and mpirun
start `minips launch` in tests/run/test_launch_group.py."""

import pytest

from minips.errors import ConfigError
from minips.run.launchenv import expand_hostlist, read_launch_env

# What torchrun 2.x sets for rank 1 of `torchrun --nproc-per-node 2` (printed by `env`).
TORCHRUN = {
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "localhost", "MASTER_PORT": "44141", "RANK": "1", "ROLE_NAME": "default",
    "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2", "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_RUN_ID": "273c1828",
    "TORCHELASTIC_USE_AGENT_STORE": "True", "WORLD_SIZE": "2",
}  # fmt: skip
# srun -N 3 -n 6 in a job on node[07-08],login2 (the Slurm documentation's variables).
SLURM = {
    "SLURM_JOB_ID": "4711", "SLURM_JOB_NODELIST": "node[07-08],login2",
    "SLURM_NODELIST": "node[07-08],login2", "SLURM_STEP_NODELIST": "node[07-08],login2",
    "SLURM_NNODES": "3", "SLURM_NTASKS": "6", "SLURM_STEP_NUM_TASKS": "6", "SLURM_PROCID": "4",
    "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_STEP_ID": "0",
    "SLURM_TASKS_PER_NODE": "2(x3)",
}  # fmt: skip
# What mpirun (Open MPI 4) sets for rank 1 of `mpirun -n 2`.
OPENMPI = {
    "OMPI_COMMAND": "minips", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_MCA_orte_hnp_uri": "505806848.0;tcp://192.0.2.2:38801", "PMIX_RANK": "1",
}  # fmt: skip
# What BytePS's launcher and ps-lite's tracker export (DMLC_WORKER_ID: BytePS, workers only).
DMLC_SERVER = {
    "DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "10.10.1.4", "DMLC_PS_ROOT_PORT": "9092",
    "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3", "DMLC_NODE_HOST": "10.10.1.5",
}  # fmt: skip


def test_torchrun_root_is_past_its_own_rendezvous_port():
    launch = read_launch_env(TORCHRUN)
    assert (launch.launcher, launch.rank, launch.world_size) == ("torchrun", 1, 2)
    assert launch.root == "tcp://localhost:44142"  # torchrun's agent listens on 44141


def test_rank_and_world_size_exported_by_hand_use_master_port_itself():
    env = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"}
    assert read_launch_env(env).root == "tcp://10.0.0.1:6000"


def test_slurm_takes_the_first_host_of_the_step_and_the_default_port():
    launch = read_launch_env(SLURM, default_port=5555)
    assert (launch.launcher, launch.rank, launch.world_size) == ("slurm", 4, 6)
    assert launch.hosts == ("node07", "node08", "login2")
    assert launch.root == "tcp://node07:5555"


def test_slurm_falls_back_to_the_job_node_list_and_honours_master_addr():
    env = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}
    env["SLURM_NODELIST"] = "gpu[3-4]"
    assert read_launch_env(env).root_host == "gpu3"
    env["MASTER_ADDR"], env["MASTER_PORT"] = "head", "7000"
    assert read_launch_env(env).root == "tcp://head:7000"


def test_open_mpi_on_one_machine_roots_on_loopback():
    launch = read_launch_env(OPENMPI, default_port=5600)
    assert (launch.launcher, launch.rank, launch.world_size) == ("openmpi", 1, 2)
    assert launch.root == "tcp://127.0.0.1:5600"


def test_the_launchers_precedence():
    both = {**SLURM, **TORCHRUN}  # torchrun started inside an srun step
    assert read_launch_env(both).launcher == "torchrun"
    assert read_launch_env({**SLURM, **DMLC_SERVER}).launcher == "slurm"
    # mpirun inside an allocation: its processes inherit a daemon's SLURM_PROCID
    inherited = {**SLURM, "SLURM_PROCID": "0", **OPENMPI}
    assert (read_launch_env(inherited).launcher, read_launch_env(inherited).rank) == ("openmpi", 1)


def test_dmlc_roles_and_counts():
    launch = read_launch_env(DMLC_SERVER)
    assert (launch.launcher, launch.rank, launch.dmlc_role) == ("dmlc", None, "server")
    assert (launch.dmlc_servers, launch.dmlc_workers, launch.root) == (2, 3, "tcp://10.10.1.4:9092")
    worker = read_launch_env({**DMLC_SERVER, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": "2"})
    assert (worker.dmlc_role, worker.dmlc_worker_id) == ("worker", 2)


def test_under_dmlc_master_addr_overrides_the_root_uri_and_the_port_stays_dmlcs():
    """MASTER_ADDR wins under every launcher (the sbatch idiom exports it); under DMLC the
    port is still DMLC_PS_ROOT_PORT (MASTER_PORT is torch's), and an empty MASTER_ADDR
    counts as unset."""
    launch = read_launch_env({**DMLC_SERVER, "MASTER_ADDR": "head", "MASTER_PORT": "7000"})
    assert launch.root == "tcp://head:9092"
    assert read_launch_env({**DMLC_SERVER, "MASTER_ADDR": ""}).root == "tcp://10.10.1.4:9092"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no launcher's variables"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not a rank of WORLD_SIZE=2"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK must be a non-negative integer"),
        ({**OPENMPI, "OMPI_COMM_WORLD_SIZE": ""}, "OMPI_COMM_WORLD_SIZE must be"),
        ({**TORCHRUN, "MASTER_PORT": "65535"}, "root port must be in 1..65535"),
        ({**DMLC_SERVER, "DMLC_ROLE": "boss"}, "DMLC_ROLE must be one of"),
        (
            {k: v for k, v in DMLC_SERVER.items() if k != "DMLC_NUM_WORKER"},
            "DMLC_NUM_WORKER is not",
        ),
        ({**SLURM, "SLURM_STEP_NODELIST": "node[1-"}, "unbalanced brackets"),
    ],
)
def test_malformed_environments_are_one_line_errors(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_launch_env(env)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("node[01-02],gpu3,gpu[9-10]", ["node01", "node02", "gpu3", "gpu9", "gpu10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("n[098-101]-ib", ["n098-ib", "n099-ib", "n100-ib", "n101-ib"]),
    ],
)
def test_slurm_host_lists_expand(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[", "node]", "node[3-1]", "node[a-b]", "n[[1]]"])
def test_bad_host_lists_are_refused(text):
    with pytest.raises(ConfigError, match="bad Slurm host list"):
        expand_hostlist(text)
