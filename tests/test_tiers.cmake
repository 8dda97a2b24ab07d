# The two tiers of the test suite (issue 37).
#
# `make test` runs every test except those labelled "long": one representative
# of each feature, strategy, mesh, refusal class and fault, within the budget
# of README's quick start. `make check-long` runs the "long" ones: the rest of
# each matrix (more world sizes, the other backend, more strategies over the
# same mesh) and the slowest fault drills. Nothing is deleted; a test moves
# between tiers by adding or removing its line below.
#
# Each line names a long test and the test of `make test` that represents it
# (the same code path at another world size, backend or strategy). Configuring
# fails when either name is unknown or when a representative is itself long,
# so a renamed test cannot drop out of both tiers unseen.
#
# Every directory of tests/ calls dtrain_label_long_tests() after its last
# add_test (the TESTS property lists only the calling directory's tests), and
# tests/CMakeLists.txt calls dtrain_check_test_tiers() at its end.
set(DTRAIN_LONG_TESTS
  # long test                                            represented in make test by
  # Fault drills: every crash point, and the resumes of the other strategies and meshes
  # (make test kills, stops and damages FSDP and DDP runs, and kills one mid-write).
  train.checkpoint.crash_points.np2                       train.checkpoint_async.kill_during_write.fsdp.np2
  train.checkpoint.sigterm_resume.ps_sync.np3             train.checkpoint.sigterm_resume.fsdp.np2
  train.checkpoint.sigterm_resume.tp.dp2_tp2.c10d         train.checkpoint.sigterm_resume.fsdp.np2
  train.checkpoint.sigterm_resume.pp.dp2_pp2.c10d         train.checkpoint.sigterm_resume.fsdp.np2
  train.checkpoint.kill_resume.ps_sync.np3                train.checkpoint.kill_resume.ddp.np2
  train.checkpoint.nonfinite.ps_sync.np3                  train.checkpoint.nonfinite.np2
  train.checkpoint.nonfinite.ps_async.np3                 train.checkpoint.nonfinite.np2
  train.checkpoint.reshard.ps_sync_to_ddp                 train.checkpoint.reshard.ps_ssp_to_single
  train.checkpoint.reshard.ddp_to_ps_sync                 train.checkpoint.reshard.fsdp_to_ps_async
  train.checkpoint.reshard.tp.dp2_tp2_to_tp4              train.checkpoint.reshard.tp.dp2_tp2_to_dp4
  train.checkpoint.reshard.tp.dp2_tp2_to_single           train.checkpoint.reshard.tp.dp2_tp2_to_dp4
  train.checkpoint.reshard.tp.single_to_dp2_tp2           train.checkpoint.reshard.tp.dp2_tp2_to_dp4
  train.checkpoint.reshard.tp.dp2_tp2_to_tp2_zero2_c10d   train.checkpoint.reshard.tp.dp2_tp2_to_dp4
  train.checkpoint.reshard.pp.dp2_pp2_to_fsdp2            train.checkpoint.reshard.pp.dp2_pp2_to_single
  train.checkpoint.reshard.pp.fsdp_dp2_pp2_to_dp1_pp2_tp2 train.checkpoint.reshard.pp.dp2_pp2_to_single
  train.checkpoint_async.sigterm_resume.fsdp.np2.c10d     train.checkpoint_async.resume.fsdp.np2
  train.checkpoint_async.resume.ddp.np2                   train.checkpoint_async.resume.fsdp.np2
  train.checkpoint_async.disk_full.np2                    train.checkpoint.disk_full.np2
  train.checkpoint_async.plan.ddp.np2                     train.checkpoint_async.plan.fsdp.np2
  train.restart.two_kills.fsdp.np2                        train.restart.two_kills.ddp.np2.c10d
  train.restart.watchdog.fsdp.np2.c10d                    train.restart.watchdog.fsdp.np2.mpi
  multihost.elastic.shrink_and_grow                       train.elastic.restart_on_hosts_that_answer
  comm.torchrun.np2                                       train.restart.torchrun.ddp.np2
  # The collectives at every world size on both backends, the 10,000-operation
  # ordering case included (make test: 3 ranks on MPI, 2 on Gloo).
  comm.collectives.mpi.np1                                comm.collectives.mpi.np3
  comm.collectives.mpi.np2                                comm.collectives.mpi.np3
  comm.collectives.mpi.np4                                comm.collectives.mpi.np3
  comm.collectives.c10d.np1                               comm.collectives.c10d.np2
  comm.collectives.c10d.np3                               comm.collectives.c10d.np2
  comm.collectives.c10d.np4                               comm.collectives.c10d.np2
  comm.collectives_debug.c10d.np3                         comm.collectives_debug.mpi.np3
  # The engines' equivalence and features at the other world sizes (make test keeps
  # one with uneven shards and splits, mostly 3 ranks, and each engine once on c10d).
  ddp.equivalence.mpi.np1                                 ddp.equivalence.mpi.np3
  ddp.equivalence.mpi.np2                                 ddp.equivalence.mpi.np3
  ddp.equivalence.mpi.np4                                 ddp.equivalence.mpi.np3
  ddp.ddp_features.mpi.np1                                ddp.ddp_features.mpi.np3
  ddp.ddp_views.mpi.np1                                   ddp.ddp_views.mpi.np3
  ddp.ddp_rebuild_buckets.mpi.np1                         ddp.ddp_rebuild_buckets.mpi.np3
  ddp.ddp_static_graph.mpi.np1                            ddp.ddp_static_graph.mpi.np3
  ddp.comm_hooks.mpi.np1                                  ddp.comm_hooks.mpi.np3
  ddp.clip_grad_norm.mpi.np1                              ddp.clip_grad_norm.mpi.np3
  ddp.join.mpi.np2                                        ddp.join.mpi.np3
  fsdp.equivalence.mpi.np1                                fsdp.equivalence.mpi.np3
  fsdp.equivalence.mpi.np2                                fsdp.equivalence.mpi.np3
  fsdp.equivalence.mpi.np4                                fsdp.equivalence.mpi.np3
  fsdp.features.mpi.np1                                   fsdp.features.mpi.np3
  fsdp.features.mpi.np2                                   fsdp.features.mpi.np3
  fsdp.deferred_init.mpi.np1                              fsdp.deferred_init.mpi.np3
  fsdp.deferred_init.mpi.np2                              fsdp.deferred_init.mpi.np3
  fsdp.deferred_init.mpi.np4                              fsdp.deferred_init.mpi.np3
  fsdp.data_dependent.mpi.np2                             fsdp.data_dependent.mpi.np3
  fsdp.join.mpi.np2                                       fsdp.join.mpi.np3
  tp.layers.mpi.np1                                       tp.layers.mpi.np3
  tp.layers.mpi.np2                                       tp.layers.mpi.np3
  tp.layers.mpi.np4                                       tp.layers.mpi.np3
  tp.layers.c10d.np3                                      tp.layers.c10d.np2
  tp.gpt_equivalence.mpi.np1                              tp.gpt_equivalence.mpi.np4
  tp.gpt_equivalence.mpi.np2                              tp.gpt_equivalence.mpi.np4
  tp.gpt_equivalence.mpi.np3                              tp.gpt_equivalence.mpi.np4
  tp.gpt_equivalence.c10d.np4                             tp.gpt_equivalence.c10d.np2
  pp.gpt_equivalence.mpi.np1                              pp.gpt_equivalence.mpi.np3
  pp.gpt_equivalence.mpi.np4                              pp.gpt_equivalence.mpi.np3
  pp.gpt_equivalence.c10d.np3                             pp.gpt_equivalence.c10d.np2
  ps.server.mpi.np4                                       ps.server.mpi.np3
  checkpoint.sharded.np1                                  checkpoint.sharded.np3
  checkpoint.sharded.np2                                  checkpoint.sharded.np3
  checkpoint.sharded.np4                                  checkpoint.sharded.np3
  cuda.training_on_cpu.c10d.np3                           cuda.training_on_cpu.c10d.np2
  # The end-to-end runs of the other strategies over a mesh already covered.
  train.fsdp_compress.demo_gpt_100_steps                  fsdp.compression.mpi.np2
  train.tp.zero2.dp2_tp2.mpi                              train.tp.fsdp.dp2_tp2.mpi
  train.tp.hsdp.dp2_tp2.mpi                               train.tp.fsdp.dp2_tp2.mpi
  train.tp.single.dp1_tp2.mpi                             train.tp.ddp.dp1_tp2.c10d
  train.tp.ddp.dp2_tp2.clip.mpi                           train.tp.fsdp.dp2_tp2.clip.mpi
  train.pp.single.pp2.gpipe.mpi                           train.pp.fsdp.dp2_pp2.gpipe.clip.mpi
  train.pp.zero2.dp2_pp2.1f1b.c10d                        train.pp.ddp.dp2_pp2.1f1b.mpi
  train.pp.zero2.dp2_pp2.1f1b.microbatch_gather.c10d      train.pp.fsdp.dp2_pp2.gpipe.microbatch_gather.mpi
  train.pp.single.dp1_pp2_tp2.gpipe.clip.c10d             train.pp.ddp.dp1_pp2_tp2.1f1b.mpi
  # Llama on meshes (issue 39): the rest of the matrix; make test runs the whole
  # key/value heads at tp 4 (clipped), the split ones with sequence parallelism,
  # the untied pipeline under ZeRO-2, the tied one on (1, 2, 2), and a reshard
  # from whole key/value heads to split ones.
  train.tp.fsdp.dp2_tp2.sequence_parallel.mpi             train.tp.llama.fsdp.dp2_tp2.sequence_parallel.tied.mpi
  train.tp.llama.fsdp.dp1_tp4.gqa8_2.mpi                  train.tp.llama.ddp.dp1_tp4.gqa8_2.clip.mpi
  train.tp.llama.ddp.dp2_tp2.mha4_4.clip.mpi              train.tp.llama.ddp.dp1_tp4.gqa8_2.clip.mpi
  train.tp.llama.fsdp.dp1_tp4.mha4_4.c10d                 train.tp.llama.ddp.dp1_tp4.gqa8_2.clip.mpi
  train.tp.llama.fsdp.dp2_tp2.gqa8_2.mpi                  train.tp.llama.fsdp.dp2_tp2.sequence_parallel.tied.mpi
  train.tp.llama.fsdp.dp2_tp2.gqa8_2.clip.c10d            train.tp.llama.fsdp.dp2_tp2.sequence_parallel.tied.mpi
  train.tp.llama.single.dp1_tp2.gqa8_2.mpi                train.tp.llama.fsdp.dp2_tp2.sequence_parallel.tied.mpi
  train.pp.llama.single.pp2.gpipe.tied.mpi                train.pp.llama.single.dp1_pp2_tp2.1f1b.tied.clip.c10d
  train.pp.llama.fsdp.dp2_pp2.gpipe.tied.clip.mpi         train.pp.llama.single.dp1_pp2_tp2.1f1b.tied.clip.c10d
  train.pp.llama.single.pp2.1f1b.mpi                      train.pp.llama.zero2.dp2_pp2.1f1b.c10d
  train.pp.llama.ddp.dp2_pp2.1f1b.mpi                     train.pp.llama.zero2.dp2_pp2.1f1b.c10d
  train.checkpoint.reshard.llama.dp2_tp2_to_pp2_tp2       train.checkpoint.reshard.llama.tp4_to_dp2_tp2
  train.same_losses.bf16.pp_tp.ddp.c10d                   train.same_losses.bf16.pp.fsdp
  # Interleaved 1F1B: make test runs it alone on 2 ranks, under DDP and under FSDP with Llama.
  train.pp.interleaved.zero2.dp1_pp2_tp2_v2.mpi           train.pp.interleaved.llama.fsdp.dp2_pp2_v2.tied.clip.mpi
  train.pp.interleaved.single.pp4_v2.mpi                  train.pp.interleaved.single.pp2_v2.mpi
  train.pp.sequence_parallel.interleaved.zero2.dp1_pp2_tp2_v2.mpi train.pp.sequence_parallel.fsdp.dp1_pp2_tp2.mpi
  # Context parallelism: the ring at 1 and 3 ranks, the GPT at cp 4 and with sequence
  # parallelism, the ring without overlap, bf16 (make test: the ring at 2 and 4 ranks, Llama on
  # (dp, cp) and (cp, tp), the GPT with pp, activation checkpointing without overlap).
  cp.ring_attention.mpi.np1                               cp.ring_attention.mpi.np2
  cp.ring_attention.mpi.np3                               cp.ring_attention.mpi.np4
  cp.ring_attention.c10d.np3                              cp.ring_attention.c10d.np2
  train.cp.gpt.ddp.cp4.mpi                                train.cp.llama.fsdp.dp2_cp2.clip.mpi
  train.cp.gpt.fsdp.cp2_tp2.sequence_parallel.mpi         train.cp.llama.zero2.cp2_tp2.c10d
  train.cp.llama.ddp.cp2.overlap_off.c10d                 train.same_losses.cp.activation_checkpointing
  train.same_losses.bf16.cp                               train.same_losses.bf16.pp.fsdp
  train.cp.llama.fsdp.pp2_cp2_tp2.mpi                     train.cp.gpt.fsdp.pp2_cp2.1f1b.mpi
  # The plan against the allocator at other world sizes: the same tests on two ranks,
  # and plan.llama.mpi.np4 replays pipeline stages and tp slices on four.
  plan.llama.np1                                          plan.llama.mpi.np2
  plan.tp.mpi.np4                                         plan.mpi.np2
  plan.pp.mpi.np4                                         plan.mpi.np2
  models.hugging_face.meshes                              models.hugging_face
  custom_model.sigterm_resume.zero2.np2                   custom_model.restart.fsdp.np2
  train.ps.sync_clip_equals_ddp                           train.ps.async_clip_equals_single
  train.ps.sync_backup_worker_rank0_late                  train.ps.sync_backup_worker
)

function(dtrain_label_long_tests)
  get_property(tests DIRECTORY PROPERTY TESTS)
  set_property(GLOBAL APPEND PROPERTY DTRAIN_ALL_TESTS ${tests})
  list(LENGTH DTRAIN_LONG_TESTS count)
  if(count EQUAL 0)
    return()
  endif()
  math(EXPR last "${count} - 1")
  foreach(i RANGE 0 ${last} 2)
    list(GET DTRAIN_LONG_TESTS ${i} test)
    if(test IN_LIST tests)
      set_property(TEST ${test} APPEND PROPERTY LABELS long)
    endif()
  endforeach()
endfunction()

function(dtrain_check_test_tiers)
  get_property(all GLOBAL PROPERTY DTRAIN_ALL_TESTS)
  list(LENGTH DTRAIN_LONG_TESTS count)
  math(EXPR odd "${count} % 2")
  if(NOT odd EQUAL 0)
    message(FATAL_ERROR "tests/test_tiers.cmake: DTRAIN_LONG_TESTS must be pairs of a long test and its representative")
  endif()
  if(count EQUAL 0)
    return()
  endif()
  set(long "")
  math(EXPR last "${count} - 1")
  foreach(i RANGE 0 ${last} 2)
    list(GET DTRAIN_LONG_TESTS ${i} test)
    list(APPEND long ${test})
  endforeach()
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET DTRAIN_LONG_TESTS ${i} test)
    list(GET DTRAIN_LONG_TESTS ${j} representative)
    if(NOT test IN_LIST all)
      message(FATAL_ERROR "tests/test_tiers.cmake lists '${test}' as long, but no such test exists: "
                          "rename or remove its line")
    endif()
    if(NOT representative IN_LIST all)
      message(FATAL_ERROR "tests/test_tiers.cmake: '${test}' is represented by '${representative}', "
                          "but no such test exists: name a test of make test")
    endif()
    if(representative IN_LIST long)
      message(FATAL_ERROR "tests/test_tiers.cmake: '${test}' is represented by '${representative}', "
                          "which is itself long: name a test that make test runs")
    endif()
  endforeach()
endfunction()
