set datafile missing '?'
set terminal pngcairo size 1100,600 font 'sans,11' noenhanced
set output 'results/study/report/fmnist-mlp-curves-lr_scalingsqrt-reductionsum.png'
set multiplot layout 1,2 title 'fmnist-mlp (lr_scalingsqrt-reductionsum)'
set grid
set key bottom right
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-0.dat' using 1:2 with linespoints lw 2 title '1 replica', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-1.dat' using 1:2 with linespoints lw 2 title '2 replicas', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-2.dat' using 1:2 with linespoints lw 2 title '4 replicas', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-3.dat' using 1:2 with linespoints lw 2 title '8 replicas'
set key top right
set ylabel 'train loss (log scale)'
set logscale y
plot 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-0.dat' using 1:3 with linespoints lw 2 title '1 replica', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-1.dat' using 1:3 with linespoints lw 2 title '2 replicas', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-2.dat' using 1:3 with linespoints lw 2 title '4 replicas', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-3.dat' using 1:3 with linespoints lw 2 title '8 replicas'
unset logscale y
unset multiplot
set terminal svg size 1100,600 font 'sans,11' noenhanced
set output 'results/study/report/fmnist-mlp-curves-lr_scalingsqrt-reductionsum.svg'
set multiplot layout 1,2 title 'fmnist-mlp (lr_scalingsqrt-reductionsum)'
set grid
set key bottom right
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-0.dat' using 1:2 with linespoints lw 2 title '1 replica', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-1.dat' using 1:2 with linespoints lw 2 title '2 replicas', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-2.dat' using 1:2 with linespoints lw 2 title '4 replicas', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-3.dat' using 1:2 with linespoints lw 2 title '8 replicas'
set key top right
set ylabel 'train loss (log scale)'
set logscale y
plot 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-0.dat' using 1:3 with linespoints lw 2 title '1 replica', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-1.dat' using 1:3 with linespoints lw 2 title '2 replicas', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-2.dat' using 1:3 with linespoints lw 2 title '4 replicas', 'results/study/report/data/fmnist-mlp-curves-lr_scalingsqrt-reductionsum-3.dat' using 1:3 with linespoints lw 2 title '8 replicas'
unset logscale y
unset multiplot
set output
