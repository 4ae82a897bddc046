"""The quick tier (`make test`, docs/tests.md): every unit test, and of the real-engine tests what a change most
often breaks: the chain on one engine with its options and teardown, the testing kit, the no-orphan layers, one
test of each other command and way in. Every other test in tests/integration is marked `full` (conftest.py) and
runs in `make test-all` and CI. A name here that no test has fails tests/unit/test_quick_tier.py."""

from __future__ import annotations

ALL = "*"

QUICK: dict[str, str | frozenset[str]] = {
    "test_chain_docker": ALL,
    "test_mounts_docker": ALL,
    "test_parallel_bringup": frozenset(
        {
            "test_every_container_starts_before_any_stage_announces_and_the_demo_matches",
            "test_sigkill_of_the_launcher_while_stages_wait_for_their_handoff_leaves_nothing",
            "test_sigterm_while_stages_wait_stops_them_within_the_grace",
        }
    ),
    "test_testing_kit": frozenset(
        {
            "test_a_chain_waits_for_a_line_and_for_its_end_and_says_why_not",
            "test_a_stage_container_that_exits_by_itself_says_how_and_leaves_no_thread",
            "test_chain_tears_down_when_the_block_raises",
            "test_exited_before_announcing_and_timed_out_are_different_errors",
            "test_stage_container_builders_take_effect",
            "test_stage_container_stop_on_a_sigterm_ignoring_stage_takes_about_one_grace",
            "test_the_leak_guard_fails_the_test_that_left_a_container_and_removes_it",
            "test_a_stage_name_someone_else_holds_is_named_and_never_touched",
        }
    ),
    "test_chaos": frozenset(
        {
            "test_layer_guard_alone",
            "test_layer_lifeline_alone",
            "test_layer_watchdog_when_the_guard_is_removed_by_another_client",
        }
    ),
    "test_adversarial": frozenset(
        {
            "test_a_name_held_by_a_foreign_container_is_exit_2_and_the_holder_is_untouched",
            "test_a_detached_run_killed_with_its_watchdog_during_bring_up_goes_by_its_lifeline",
            "test_a_user_the_engine_refuses_is_told_so_never_to_start_it",
        }
    ),
    "test_node_docker": frozenset(
        {
            "test_exit_codes_propagate",
            "test_stdout_passes_through_byte_for_byte",
            "test_environment_rows_as_the_engine_sees_them",
            "test_stale_name_of_a_live_owner_is_an_error_and_untouched",
        }
    ),
    "test_runs_cmd": frozenset(
        {
            "test_ps_filter_and_format_and_down_of_two_runs_at_once",
            "test_wait_until_announced_prints_each_address_and_until_exit_each_code",
            "test_logs_prints_every_stage_prefixed_and_takes_a_prefix_of_the_run",
        }
    ),
    "test_restarts": frozenset(
        {
            "test_a_stage_that_fails_once_is_restarted_and_the_run_completes",
            "test_sigterm_during_the_backoff_is_143_at_once",
        }
    ),
    "test_gpu_docker": frozenset(
        {
            "test_concurrent_chains_get_disjoint_gpus_and_a_third_gets_exit_2",
            "test_gpus_held_by_a_running_labelled_container_are_avoided",
        }
    ),
    "test_worker_docker": frozenset({"test_worker_check_passes_on_the_stub"}),
    "test_compose_docker": frozenset({"test_a_four_stage_demo_starts_every_service_at_once_and_down_leaves_nothing"}),
    "test_neighbours": frozenset(
        {
            "test_a_container_forging_a_live_runs_labels_survives_its_teardown_down_and_gc",
            "test_prune_at_every_phase_of_a_detached_run_loses_nothing_and_leaves_nothing",
        }
    ),
    "test_docker_client": ALL,
    "test_images_docker": ALL,
    "test_swactor_stages": frozenset({"test_a_chain_of_pp_worker_stages_joins_the_seed_and_each_stage_gets_its_peers"}),
    "test_dead_terminal": frozenset(
        {"test_a_terminal_that_goes_away_ends_the_chain_with_129_and_every_stage_torn_down"}
    ),
    "test_threads": frozenset({"test_a_chain_leaves_no_thread"}),
    "test_guard": frozenset(
        {
            "test_an_attach_to_the_guard_its_logs_and_a_second_session_change_nothing",
            "test_a_guard_another_client_ends_is_replaced_within_a_second_and_said",
        }
    ),
}


def quick(module: str, function: str) -> bool:
    """Whether an integration test (its module's name, its function's name) is in the quick tier."""
    chosen = QUICK.get(module, frozenset())
    return chosen == ALL or function in chosen
